#!/usr/bin/env bash
# usage: build.sh                 build the image
#        build.sh --check-engine  exit 0 if a Docker engine answers, else 1
#
# Build the image: resolve the base (pull it, or build it from Debian packages when
# no registry answers), pass the host's CA bundle as a BuildKit secret, stamp the
# labels, and run one BuildKit build with progress shown. `make image` calls this.
#
# Settings (environment; the Makefile passes its variables through):
#   IMAGE                 tag to build                       (multinode:dev)
#   BASE_IMAGE            base to pull                       (debian:trixie-slim)
#   OFFLINE_BASE          1: skip the pull, build the base from Debian packages
#   OFFLINE_BASE_IMAGE    tag of that offline base           (multinode-base:trixie-slim)
#   DEBIAN_MIRROR         mirror for the offline base        (http://deb.debian.org/debian)
#   CA_BUNDLE             CA bundle to trust in the build, or "none"
#                         (default: PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE, system bundle)
#   ARCH                  amd64 (x86-64 nodes) or arm64 (Grace nodes: GH200, GB200),
#                         built under QEMU on an amd64 machine       (this machine's)
#   CUDA                  12 (torch 2.10, any driver from 525) or 13 (torch 2.14, driver
#                         580 or newer; CUDA torch on arm64 too)      (12)
#   TORCH_CUDA_ARCH_LIST  GPU archs DeepSpeed's ops are built for
#                         (CUDA 12: "8.0;9.0+PTX;10.0;12.0", CUDA 13: "8.0;9.0;10.0;10.3;12.0+PTX")
#   MAX_JOBS              parallel compile jobs for those ops  (4)
#   PROGRESS              BuildKit progress: auto, plain, tty  (auto)
#   DOCKER                docker client with BuildKit          (found below)
#   BUILD_ARGS            extra arguments for docker build
#   BINFMT_AARCH64        binfmt_misc's entry for arm64 programs, read for ARCH=arm64 CUDA=13
#                         (/proc/sys/fs/binfmt_misc/qemu-aarch64)
set -euo pipefail
cd "$(dirname "$0")/.."

host_arch=$(dpkg --print-architecture 2>/dev/null || { [ "$(uname -m)" = aarch64 ] && echo arm64 || echo amd64; })
ARCH=${ARCH:-$host_arch}
case $ARCH in amd64|arm64) ;; *) echo "make image: ARCH=$ARCH: amd64 or arm64." >&2; exit 2;; esac
CUDA=${CUDA:-12}
case $CUDA in 12|13) ;; *) echo "make image: CUDA=$CUDA: 12 or 13 (13 needs driver 580 or newer on the nodes)." >&2; exit 2;; esac
suffix=$([ "$ARCH" = "$host_arch" ] || echo "-$ARCH")
line=$([ "$CUDA" = 12 ] || echo "-cu$CUDA")
IMAGE=${IMAGE:-multinode:dev$line$suffix}
BASE_IMAGE=${BASE_IMAGE:-debian:trixie-slim}
OFFLINE_BASE_IMAGE=${OFFLINE_BASE_IMAGE:-multinode-base:trixie-slim$suffix}
# The GPUs DeepSpeed's prebuilt ops have cubins for (+PTX: and PTX), per CUDA line: CUDA 12.4's
# nvcc writes no sm_100 or sm_120 itself (docker/nvcc_newarch.py), CUDA 13 writes them all.
ARCHS_CUDA12="8.0;9.0+PTX;10.0;12.0"
ARCHS_CUDA13="8.0;9.0;10.0;10.3;12.0+PTX"
archs=$ARCHS_CUDA12
if [ "$CUDA" = 13 ]; then archs=$ARCHS_CUDA13; fi
TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$archs}
MAX_JOBS=${MAX_JOBS:-4}
PROGRESS=${PROGRESS:-auto}

say() { echo "==> $*" >&2; }
die() { echo "make image: $*" >&2; exit 2; }

# shellcheck source=docker/docker-client.sh
. docker/docker-client.sh
if [ "${1:-}" = --check-engine ]; then exec "$DOCKER" info >/dev/null 2>&1; fi
"$DOCKER" info >/dev/null 2>&1 || die "DOCKER=$DOCKER: no Docker engine answers. Start dockerd (or set DOCKER)."

# Base: local copy, else pull, else (Debian trixie bases only) build it offline.
base=$BASE_IMAGE
if [ "${OFFLINE_BASE:-0}" = 1 ]; then
  base=$OFFLINE_BASE_IMAGE
elif [ -z "$suffix" ] && "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  say "base $BASE_IMAGE: present locally"
elif "$DOCKER" pull --platform "linux/$ARCH" "$BASE_IMAGE" >/dev/null 2>&1; then
  say "base $BASE_IMAGE: pulled"
else
  case $BASE_IMAGE in
    debian:trixie-slim|docker.io/library/debian:trixie-slim) ;;
    *) die "BASE_IMAGE=$BASE_IMAGE: cannot be pulled, and only debian:trixie-slim can be built offline. Pull it, or leave BASE_IMAGE unset." ;;
  esac
  say "base $BASE_IMAGE: cannot be pulled (no registry reachable); using the same base built from Debian packages, $OFFLINE_BASE_IMAGE"
  base=$OFFLINE_BASE_IMAGE
fi
if [ "$base" = "$OFFLINE_BASE_IMAGE" ]; then
  if "$DOCKER" image inspect "$OFFLINE_BASE_IMAGE" >/dev/null 2>&1; then
    say "base $OFFLINE_BASE_IMAGE: present locally (make base rebuilds it)"
  else
    say "building $OFFLINE_BASE_IMAGE with debootstrap (docker/base/build-base.sh)"
    ARCH=$ARCH docker/base/build-base.sh "$OFFLINE_BASE_IMAGE" trixie "${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  fi
fi

# CA bundle, as a secret: trusted by apt, pip and uv in the build, never in a layer.
secret=()
ca=${CA_BUNDLE:-}
if [ -z "$ca" ]; then
  for c in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" "${REQUESTS_CA_BUNDLE:-}" \
           /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do
    if [ -n "$c" ] && [ -s "$c" ]; then ca=$c; break; fi
  done
fi
if [ -n "$ca" ] && [ "$ca" != none ]; then
  [ -s "$ca" ] || die "CA_BUNDLE=$ca: no such file. Point it at a PEM bundle, or set CA_BUNDLE=none."
  say "CA bundle $ca: passed to the build as secret \"ca\""
  secret=(--secret "id=ca,src=$ca")
fi

lock=docker/requirements$line$([ "$ARCH" = amd64 ] || echo "-$ARCH").lock
# CUDA 13: no Debian toolkit; the lock's nvcc wheel compiles DeepSpeed's ops (docker/Dockerfile).
cuda_args=(--build-arg "CUDA_MAJOR=$CUDA")
if [ "$CUDA" != 12 ]; then cuda_args+=(--build-arg CUDA_TOOLKIT=); fi
# Per architecture: the CPU code DeepSpeed's ops are compiled for (any x86-64 server since
# 2013-2015; any Arm server core from Neoverse N1 and Graviton 2 up, Grace included). On
# arm64 under CUDA 12, no CUDA toolkit or CUDA op: PyPI's torch 2.10 for aarch64 is a CPU
# build; torch 2.14 for aarch64 (CUDA 13) is a CUDA one.
arch_args=()
if [ "$ARCH" = arm64 ]; then
  arch_args=(--platform linux/arm64
             --build-arg "DS_CPU_ARCH=${DS_CPU_ARCH:--march=armv8.2-a}"
             --build-arg "DS_SIMD_WIDTH=${DS_SIMD_WIDTH:--D__SCALAR__}"
             --build-arg UV_COMPILE_BYTECODE_TIMEOUT=1800)
  if [ "$CUDA" = 12 ]; then arch_args+=(--build-arg CUDA_TOOLKIT= --build-arg DS_CUDA_OPS=0); fi
elif [ -n "$suffix" ]; then
  arch_args=(--platform linux/amd64)
fi
# Under emulation: PyPI's torch 2.14.1 for aarch64 dies as it is imported under QEMU 7.2
# (Debian 12's qemu-user-static), at the DeepSpeed stage 24 min into the build here; QEMU 10.0
# runs it. Nothing between was tried: older than 10 is refused.
if [ "$ARCH" = arm64 ] && [ "$CUDA" = 13 ] && [ "$host_arch" != arm64 ]; then
  interp=$(sed -n 's/^interpreter //p' "${BINFMT_AARCH64:-/proc/sys/fs/binfmt_misc/qemu-aarch64}" 2>/dev/null || true)
  qemu=$( (exec -a qemu-aarch64 "$interp" --version) 2>/dev/null | sed -n 's/^qemu-aarch64 version \([0-9]*\)\..*/\1/p' || true)
  if [ -z "$qemu" ] || [ "$qemu" -lt 10 ]; then
    die "ARCH=arm64 CUDA=13: arm64 programs run under ${interp:-no QEMU} (QEMU ${qemu:-?}), where torch 2.14.1 for aarch64 crashed as it was imported (QEMU 7.2; 10.0 runs it): run \`make qemu\` (as root: Debian 13's QEMU 10 for arm64), then build again."
  fi
fi
lock_sha=$(sha256sum "$lock" | cut -d' ' -f1)
version=$(sed -n 's/^__version__ *= *["'\'']\([^"'\'']*\)["'\''].*/\1/p' entrypoint/__init__.py)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain -- entrypoint docker pyproject.toml 2>/dev/null)" ]; then
  revision="$revision-dirty"
fi
source_url=$(git config --get remote.origin.url 2>/dev/null || true)
case $source_url in git@github.com:*) source_url="https://github.com/${source_url#git@github.com:}";; esac
source_url=${source_url%.git}

say "building $IMAGE for $ARCH, CUDA $CUDA, on $base (lock sha256 ${lock_sha:0:12}, CUDA archs $TORCH_CUDA_ARCH_LIST)"
# shellcheck disable=SC2086
"$DOCKER" build \
  --progress="$PROGRESS" \
  -f docker/Dockerfile \
  "${secret[@]}" \
  --build-arg BASE_IMAGE="$base" \
  --build-arg LOCK_SHA256="$lock_sha" \
  --build-arg VERSION="${version:-dev}" \
  --build-arg REVISION="$revision" \
  --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  ${source_url:+--build-arg SOURCE="$source_url"} \
  --build-arg TORCH_CUDA_ARCH_LIST="$TORCH_CUDA_ARCH_LIST" \
  --build-arg MAX_JOBS="$MAX_JOBS" \
  "${cuda_args[@]}" \
  "${arch_args[@]}" \
  ${BUILD_ARGS:-} \
  -t "$IMAGE" .
say "built $IMAGE"
