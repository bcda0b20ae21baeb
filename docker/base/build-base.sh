#!/usr/bin/env bash
# Build the base image from Debian's packages when no registry can be reached.
#
# It reproduces what debuerreotype does for the official debian:<suite>-slim
# image: debootstrap --variant=minbase, trixie + trixie-updates + trixie-security,
# upgraded, slimmed (no docs, man pages or locales), apt's lists emptied. The
# package set is checked against docker/base/packages.txt, the manifest of the
# official image, so both paths give the same packages.
#
# usage: build-base.sh TAG [SUITE] [MIRROR]
#        ARCH=arm64 build-base.sh ...   another Debian architecture (Grace nodes): its
#                                        programs run under QEMU (qemu-user-static, binfmt-support)
set -euo pipefail

tag=${1:?usage: build-base.sh TAG [SUITE] [MIRROR]}
suite=${2:-trixie}
mirror=${3:-http://deb.debian.org/debian}
security_mirror=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=docker/docker-client.sh
. "$here/../docker-client.sh"
docker=$DOCKER
host_arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
arch=${ARCH:-$host_arch}

if [ "$(id -u)" != 0 ]; then
  echo "build-base.sh: debootstrap needs root; run it as root (sudo make base)." >&2
  exit 2
fi
if ! command -v debootstrap >/dev/null; then
  echo "build-base.sh: debootstrap is missing. Install it: apt-get install -y debootstrap" >&2
  exit 2
fi

work=$(mktemp -d /var/tmp/base-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs

qemu=qemu-${arch/arm64/aarch64}
if [ "$arch" != "$host_arch" ] && [ ! -e "/proc/sys/fs/binfmt_misc/$qemu" ] \
    && command -v update-binfmts >/dev/null; then
  # binfmt-support registers QEMU at boot where systemd runs; in a container or a bare VM
  # the kernel's binfmt_misc may need mounting first.
  [ -e /proc/sys/fs/binfmt_misc/register ] \
    || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
  update-binfmts --enable "$qemu" 2>/dev/null || true
fi
if [ "$arch" != "$host_arch" ] && [ ! -e "/proc/sys/fs/binfmt_misc/$qemu" ]; then
  echo "build-base.sh: ARCH=$arch: this $host_arch machine cannot run $arch programs. Install" \
    "qemu-user-static and binfmt-support (apt-get install -y qemu-user-static binfmt-support)." >&2
  exit 2
fi

echo "==> debootstrap --arch=$arch --variant=minbase $suite from $mirror"
debootstrap --arch="$arch" --variant=minbase "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -30 "$work/debootstrap.log" >&2; exit 1; }

# The official image's apt and dpkg settings (debuerreotype-minimizing-config, slimify).
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
# as in the official slim images: no docs, man pages or locales
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
CFG
echo 'force-unsafe-io' >"$root/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
echo 'Acquire::GzipIndexes "true";' >"$root/etc/apt/apt.conf.d/docker-gzip-indexes"
echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"

rm -f "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security_mirror
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC

echo "==> apt-get dist-upgrade (point release and security updates)"
cp /etc/resolv.conf "$root/etc/resolv.conf"
chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -c \
  'apt-get update -qq && apt-get dist-upgrade -y -qq >/dev/null && apt-get clean'

# slimify: drop what the dpkg excludes above would have kept out
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root/usr/share/man"/* "$root/usr/share/info"/* "$root/usr/share/groff"/* \
  "$root/usr/share/lintian/overrides"/* "$root/usr/share/linda"/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
rm -rf "$root/var/lib/apt/lists"/* "$root/var/cache/apt"/* "$root/var/log"/*.log \
  "$root/var/cache/debconf"/*-old "$root/var/lib/dpkg"/*-old "$root/tmp"/* "$root/root/.cache"
: >"$root/etc/resolv.conf"

# shellcheck disable=SC2016  # dpkg's format, not a shell expansion
chroot "$root" dpkg-query -W -f '${Package}\n' | sort >"$work/packages.txt"
if ! grep -v '^#' "$here/packages.txt" | diff -u - "$work/packages.txt"; then
  echo "build-base.sh: the package set differs from docker/base/packages.txt (the official $suite-slim manifest)." >&2
  echo "If Debian changed its required set, update docker/base/packages.txt." >&2
  exit 1
fi

if [ "$arch" = "$host_arch" ]; then
  echo "==> docker import $tag"
  tar --numeric-owner --xattrs -C "$root" -c . \
    | "$docker" import \
        --change 'CMD ["bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --message "debootstrap --variant=minbase $suite, slim, built offline by docker/base/build-base.sh" \
        - "$tag" >/dev/null
else
  # Docker 20.10's `import --platform` needs an experimental daemon and records the host's
  # architecture otherwise: a one-layer build FROM scratch records the one asked for.
  echo "==> docker build --platform linux/$arch $tag (FROM scratch, the rootfs added)"
  mkdir "$work/context"
  tar --numeric-owner --xattrs -C "$root" -cf "$work/context/rootfs.tar" .
  printf '%s\n' 'FROM scratch' 'ADD rootfs.tar /' \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'CMD ["bash"]' \
    >"$work/context/Dockerfile"
  DOCKER_BUILDKIT=1 "$docker" build -q --platform "linux/$arch" -t "$tag" "$work/context" >/dev/null
fi
echo "==> built $tag from Debian packages ($(wc -l <"$work/packages.txt") packages)"
