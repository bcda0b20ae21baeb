#!/usr/bin/env bash
# usage: push.sh DEST     push the built image IMAGE to DEST (registry/repository:tag)
#
# With skopeo, straight from the Docker engine, so that the layers can be recompressed:
#   COMPRESSION=gzip  (default) a Docker v2 manifest of gzip layers: every engine pulls it,
#                     Docker 20.10 (Debian bookworm's) included
#   COMPRESSION=zstd  an OCI manifest of zstd layers: pulled by containerd 1.5+ (Kubernetes
#                     nodes), Docker 23+, Podman; not by Docker 20.10
# Each layer is compressed on its own, so a registry serves them, and a node fetches them,
# in parallel. Push each build under a new tag (the lock's hash, a version): nodes never
# re-pull a tag they hold (imagePullPolicy: IfNotPresent).
#
# Room: the engine first writes the image out under its own folder (/var/lib/docker/tmp), and
# skopeo copies that stream into a file under TMPDIR: the image's size free in each, twice
# it when they share a disk. Checked before pushing.
#
# Settings (environment): IMAGE (multinode:dev), COMPRESSION, TLS_VERIFY (true; false for a
# registry on loopback without TLS), TMPDIR (/var/tmp; skopeo 1.9 reads only its --tmpdir,
# which this passes). Log in first with `skopeo login REGISTRY`.
set -euo pipefail
IMAGE=${IMAGE:-multinode:dev}
COMPRESSION=${COMPRESSION:-gzip}
TLS_VERIFY=${TLS_VERIFY:-true}
dest=${1:-}
[ -n "$dest" ] || { echo "usage: $0 REGISTRY/REPOSITORY:TAG (IMAGE=$IMAGE)" >&2; exit 2; }
command -v skopeo >/dev/null || { echo "push: skopeo not found (apt-get install skopeo)" >&2; exit 2; }
case $COMPRESSION in
  gzip) format=v2s2 ;;
  zstd) format=oci ;;
  *) echo "push: COMPRESSION=$COMPRESSION: gzip or zstd" >&2; exit 2 ;;
esac
tmp=${TMPDIR:-/var/tmp}
size=$(docker image inspect --format '{{.Size}}' "$IMAGE" 2>/dev/null) \
  || { echo "push: IMAGE=$IMAGE: no such image here (make image, or set IMAGE)" >&2; exit 2; }
engine_tmp=$(docker info --format '{{.DockerRootDir}}')/tmp
free_bytes() { df -P --block-size=1 "$1" | awk 'NR==2 {print $4}'; }
need_tmp=$size
[ "$(stat -c %d "$tmp")" = "$(stat -c %d "$engine_tmp" 2>/dev/null || stat -c %d "$tmp")" ] \
  && need_tmp=$((2 * size))
for where in "$tmp:$need_tmp" "$engine_tmp:$size"; do
  dir=${where%:*} need=${where##*:}
  [ -d "$dir" ] || continue
  free=$(free_bytes "$dir")
  if [ "$free" -lt "$need" ]; then
    awk -v dir="$dir" -v free="$free" -v need="$need" -v image="$IMAGE" 'BEGIN {
      printf "push: %s has %.1f GB free; pushing %s needs %.1f GB there (the engine'"'"'s copy of the image, then skopeo'"'"'s): free some (docker image prune, docker builder prune), or set TMPDIR to another disk\n", dir, free / 1e9, image, need / 1e9 }' >&2
    exit 2
  fi
done
echo "==> pushing $IMAGE to $dest ($COMPRESSION layers, $format manifest)" >&2
skopeo --tmpdir "$tmp" copy --quiet --dest-tls-verify="$TLS_VERIFY" --format "$format" \
  --dest-compress --dest-compress-format "$COMPRESSION" \
  "docker-daemon:$IMAGE" "docker://$dest"
# skopeo 1.9 (Debian bookworm) reuses a layer that the registry holds in the other compression:
# zstd after gzip silently ships gzip layers (checked here), gzip after zstd stops ("zstd
# compression is not supported for type ...tar.gzip"). Give each compression its own repository.
manifest=$(skopeo inspect --raw --tls-verify="$TLS_VERIFY" "docker://$dest")
if [ "$COMPRESSION" = zstd ] && grep -q 'tar+gzip\|tar.gzip' <<<"$manifest"; then
  echo "push: $dest has gzip layers: skopeo reused the gzip copies this registry holds." >&2
  echo "      Push zstd to another repository, or use skopeo 1.14 or later." >&2
  exit 1
fi
echo "==> pushed $dest: $(grep -o '"size": *[0-9]*' <<<"$manifest" | awk '{s += $2} END {printf "%.2f GB", s / 1e9}') compressed" >&2
