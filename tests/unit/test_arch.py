"""The image for each architecture (issue 23): a lock per architecture with the same pins where
both have a package, a wheel for every pin on its architecture (uv resolves each lock for its
platform against PyPI, hashes required), and `make image ARCH=arm64` building for linux/arm64
from the arm64 lock, without a CUDA toolkit (docker/build.sh run against a stand-in docker).
The CUDA 13 line (issue 33) the same, with CUDA torch on arm64 too."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HOST = subprocess.run(
    ["dpkg", "--print-architecture"], capture_output=True, text=True
).stdout.strip()

REPO = Path(__file__).resolve().parents[2]
LOCKS = {
    "amd64": (REPO / "docker" / "requirements.lock", "x86_64-manylinux_2_28"),
    "arm64": (REPO / "docker" / "requirements-arm64.lock", "aarch64-manylinux_2_28"),
    "cu13-amd64": (REPO / "docker" / "requirements-cu13.lock", "x86_64-manylinux_2_28"),
    "cu13-arm64": (REPO / "docker" / "requirements-cu13-arm64.lock", "aarch64-manylinux_2_28"),
}
CUDA_OWN = re.compile(r"^(nvidia-(?!ml-py$)|cuda-|torch$|triton$|jax-cuda)")


def pins(path: Path) -> dict[str, str]:
    return dict(re.findall(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", path.read_text()))


def test_the_arm64_lock_pins_what_the_amd64_lock_pins():
    amd64, arm64 = pins(LOCKS["amd64"][0]), pins(LOCKS["arm64"][0])
    assert {k: v for k, v in arm64.items() if k in amd64 and amd64[k] != v} == {}
    for name in ("torch", "jax", "jax-cuda12-plugin", "deepspeed", "accelerate", "transformers"):
        assert name in arm64, name
    # what amd64 has alone: x86-only wheels of torch's CUDA build
    alone = set(amd64) - set(arm64)
    assert alone <= {"triton", "cuda-bindings", "cuda-pathfinder"} | {
        n for n in alone if n.startswith("nvidia-")
    }, alone


def test_the_cuda_13_locks_pin_what_the_cuda_12_lock_pins_but_cuda_s_own():
    """Both arm64 and amd64 CUDA 13 locks: torch 2.14 with CUDA on both (PyPI's aarch64 torch
    2.14 is a CUDA build), the same nvcc 13.0 as torch's runtime, and every pin that is not
    CUDA's (numpy, transformers, the hub...) the CUDA 12 image's own."""
    cu12, amd64, arm64 = (pins(LOCKS[k][0]) for k in ("amd64", "cu13-amd64", "cu13-arm64"))
    assert amd64 == arm64
    assert amd64["torch"].startswith("2.14.") and amd64["jax-cuda13-plugin"] == cu12["jax"]
    assert amd64["nvidia-cuda-nvcc"] == amd64["nvidia-cuda-crt"] == amd64["nvidia-nvvm"]
    assert amd64["nvidia-cuda-nvcc"].startswith("13.0.")
    moved = {k: (cu12[k], v) for k, v in amd64.items() if k in cu12 and cu12[k] != v}
    assert {k for k in moved if not CUDA_OWN.match(k)} == set(), moved


@pytest.mark.parametrize("arch", sorted(LOCKS))
def test_every_pin_has_a_wheel_for_its_architecture(arch, tmp_path):
    """uv resolves the lock for the platform with hashes required: a pin without a wheel for it
    fails here ("has no wheels with a matching platform tag"). Needs PyPI, as `make image` does."""
    lock, platform = LOCKS[arch]
    uv = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")
    assert uv, "uv is installed by make dev"
    proc = subprocess.run(
        [
            uv, "pip", "install", "--dry-run", "--no-deps", "--require-hashes",
            "--python-platform", platform, "--python-version", "3.13",
            "--target", str(tmp_path / "t"), "-r", str(lock),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"Would install {len(pins(lock))} packages" in proc.stderr, proc.stderr[-500:]


STUB = """#!/bin/sh
# a stand-in docker: answers info and image inspect, records a build's arguments
case "$1" in
  info|image) exit 0 ;;
  build) shift; printf '%s\\n' "$@" >"$RECORD"; exit 0 ;;
esac
exit 1
"""


def qemu(tmp_path, version: str) -> Path:
    """A stand-in binfmt_misc entry for arm64 programs, its interpreter saying `version`."""
    interpreter = tmp_path / "aarch64-binfmt-P"
    interpreter.write_text(f"#!/bin/sh\necho 'qemu-aarch64 version {version} (Debian)'\n")
    interpreter.chmod(0o755)
    entry = tmp_path / "qemu-aarch64"
    entry.write_text(f"enabled\ninterpreter {interpreter}\nflags: PF\n")
    return entry


def build(arch: str, tmp_path, qemu_version: str = "10.0.13") -> subprocess.CompletedProcess:
    """docker/build.sh for `arch` against a stand-in docker that records its arguments."""
    stub = tmp_path / "docker"
    stub.write_text(STUB)
    stub.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "DOCKER": str(stub),
        "RECORD": str(tmp_path / "args"),
        "ARCH": arch.removeprefix("cu13-"),
        "CUDA": "13" if arch.startswith("cu13") else "12",
        "CA_BUNDLE": "none",
        "OFFLINE_BASE": "1",
        "BINFMT_AARCH64": str(qemu(tmp_path, qemu_version)),
    }
    return subprocess.run(
        ["docker/build.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_the_arm64_cuda_13_image_is_refused_under_qemu_7_with_the_fix(tmp_path):
    """torch 2.14.1 for aarch64 crashes as it is imported under Debian 12's QEMU 7.2 (on an
    arm64 host nothing is emulated, and nothing is checked)."""
    proc = build("cu13-arm64", tmp_path, qemu_version="7.2.22")
    if HOST == "arm64":
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("make image: ARCH=arm64 CUDA=13: arm64 programs run under "), line
    assert "(QEMU 7)" in line and "run `make qemu`" in line, line
    assert not (tmp_path / "args").exists()  # nothing built
    assert build("arm64", tmp_path, qemu_version="7.2.22").returncode == 0  # CUDA 12: CPU torch


@pytest.mark.parametrize("arch", ["amd64", "arm64", "cu13-amd64", "cu13-arm64"])
def test_make_image_arch_builds_for_that_platform_from_its_lock(arch, tmp_path):
    record = tmp_path / "args"
    proc = build(arch, tmp_path)
    assert proc.returncode == 0, proc.stderr
    args = record.read_text().splitlines()
    lock = LOCKS[arch][0]
    assert f"LOCK_SHA256={hashlib.sha256(lock.read_bytes()).hexdigest()}" in args
    host = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
    if arch.startswith("cu13"):
        assert "CUDA_MAJOR=13" in args and "CUDA_TOOLKIT=" in args, args
        assert "DS_CUDA_OPS=0" not in args  # CUDA ops on arm64 too
        assert "TORCH_CUDA_ARCH_LIST=8.0;9.0;10.0;10.3;12.0+PTX" in args
        if arch == "cu13-arm64" and host.stdout.strip() == "amd64":
            assert args[args.index("-t") + 1] == "multinode:dev-cu13-arm64"
            assert args[args.index("--platform") + 1] == "linux/arm64"
        elif arch == "cu13-amd64" and host.stdout.strip() == "amd64":
            assert args[args.index("-t") + 1] == "multinode:dev-cu13"
    elif arch == "arm64":
        assert args[args.index("--platform") + 1] == "linux/arm64"
        assert "CUDA_TOOLKIT=" in args and "DS_CUDA_OPS=0" in args
        assert "DS_CPU_ARCH=-march=armv8.2-a" in args
        if host.stdout.strip() == "amd64":
            assert args[args.index("-t") + 1] == "multinode:dev-arm64"
    else:
        assert "DS_CUDA_OPS=0" not in args and "CUDA_TOOLKIT=" not in args


def test_the_dockerfile_takes_each_architecture_s_lock():
    text = (REPO / "docker" / "Dockerfile").read_text()
    assert "ARG TARGETARCH" in text and "ARG CUDA_MAJOR=12" in text
    assert 'lock="/tmp/requirements-${CUDA_MAJOR}-${TARGETARCH:-amd64}.lock"' in text
    ignored = (REPO / "docker" / "Dockerfile.dockerignore").read_text()
    for _, (lock, _) in LOCKS.items():
        assert f"!docker/{lock.name}" in ignored, lock.name
        assert f"source=docker/{lock.name}," in text, lock.name
