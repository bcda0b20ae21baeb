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
# Settings (environment): IMAGE (multinode:dev), COMPRESSION, TLS_VERIFY (true; false for a
# registry on loopback without TLS). Log in first with `skopeo login REGISTRY`.
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
echo "==> pushing $IMAGE to $dest ($COMPRESSION layers, $format manifest)" >&2
skopeo copy --quiet --dest-tls-verify="$TLS_VERIFY" --format "$format" \
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
