#!/usr/bin/env bash
# make qemu: run arm64 (aarch64) programs under Debian 13's QEMU 10 user mode instead of
# Debian 12's QEMU 7.2, for `make image CUDA=13 ARCH=arm64` on an amd64 machine. PyPI's torch
# 2.14.1 for aarch64 dies under QEMU 7.2 as it is imported (SIGSEGV after oneDNN's "Can't open
# MIDR_EL1 sysfs entry", then a hang); under QEMU 10.0 it imports and computes.
# It downloads trixie's qemu-user package with apt (signed by Debian's archive keys), keeps its
# qemu-aarch64 under /usr/local/libexec/multinode-qemu and registers it in binfmt_misc as
# `qemu-aarch64` (flags PF: argv[0] kept, the interpreter opened now so containers use it),
# replacing the entry there. Needs root. Undo (Debian's qemu-user-static entry back):
# echo -1 >/proc/sys/fs/binfmt_misc/qemu-aarch64 && update-binfmts --enable qemu-aarch64
set -euo pipefail
die() { echo "make qemu: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "registering in binfmt_misc needs root: run it as root."
[ -w /proc/sys/fs/binfmt_misc/register ] \
  || die "/proc/sys/fs/binfmt_misc is not mounted: mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc"
SUITE=${QEMU_SUITE:-trixie}
dest=/usr/local/libexec/multinode-qemu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "deb http://deb.debian.org/debian $SUITE main" >"$work/sources.list"
apt_opts=(-o "Dir::Etc::sourcelist=$work/sources.list" -o Dir::Etc::sourceparts=- -o APT::Sandbox::User=root
          -o "Dir::State::Lists=$work/lists" -o APT::Get::List-Cleanup=0)
mkdir -p "$work/lists/partial"
apt-get update -qq "${apt_opts[@]}"
(cd "$work" && apt-get download -qq "${apt_opts[@]}" "qemu-user/$SUITE")
deb=$(find "$work" -maxdepth 1 -name 'qemu-user_*.deb' | head -1)
[ -n "$deb" ] || die "apt could not download qemu-user from $SUITE (deb.debian.org unreachable?)"
dpkg-deb -x "$deb" "$work/x"
mkdir -p "$dest"
# Debian's QEMU keeps argv[0] (binfmt's P flag) when its name ends in -binfmt-P.
install -m 0755 "$work/x/usr/bin/qemu-aarch64" "$dest/aarch64-binfmt-P"
if [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then echo -1 >/proc/sys/fs/binfmt_misc/qemu-aarch64; fi
printf '%s' ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:'"$dest"'/aarch64-binfmt-P:PF' \
  >/proc/sys/fs/binfmt_misc/register
echo "arm64 programs now run under $( (exec -a qemu-aarch64 "$dest/aarch64-binfmt-P" --version) | head -1)"
