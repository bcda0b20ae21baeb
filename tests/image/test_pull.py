"""The image through a real registry, as a Kubernetes node gets it: pushed by docker/push.sh to
Debian's docker-registry (distribution 2.8) on loopback, with zstd layers in an OCI manifest,
pulled back by a clean containerd (Debian's, with `ctr`) and run. The pulled layers are checked:
each group of the venv in a layer of its own, in docker/venv_layers.py's order, the project
above them all.

zstd rather than push.sh's default gzip: the same push and pull, in half the time here (CI's
minutes; docs/layers-and-pulls.md has the figures: push 110 s against 183 s, a cold pull 58 s
against 142 s). The gzip manifest, pulled by containerd and by Docker 20.10 (which cannot pull
zstd), is measured by `make bench-pull`, by hand.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .image_helpers import REPO

# A file of each group (of each part, for a group in parts), bottom to top; the lock and the
# project above them.
MARKERS = {
    "nvidia-cudnn": "lib/python3.13/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
    "nvidia-cublas": "lib/python3.13/site-packages/nvidia/cublas/__init__.py",
    "nvidia-nccl": "lib/python3.13/site-packages/nvidia/nccl/lib/libnccl.so.2",
    "nvidia-math": "lib/python3.13/site-packages/nvidia/cufft/__init__.py",
    "nvidia-cuda": "lib/python3.13/site-packages/nvidia/cuda_runtime/__init__.py",
    "torch": "lib/python3.13/site-packages/torch/__init__.py",
    "jax": "lib/python3.13/site-packages/jaxlib/__init__.py",
    "rest": "lib/python3.13/site-packages/transformers/__init__.py",
    "deepspeed": "lib/python3.13/site-packages/deepspeed/__init__.py",
    "lock": "share/entrypoint/lock.sha256",
    "project": "lib/python3.13/site-packages/entrypoint/__init__.py",
}
# ... and more of each group, which must be in the same layer as its marker
MORE = {
    "torch": ["lib/python3.13/site-packages/triton/__init__.py", "bin/torchrun"],
    "jax": ["lib/python3.13/site-packages/jax/__init__.py"],
    "nvidia-nccl": ["lib/python3.13/site-packages/nvidia/nvshmem"],
    "nvidia-math": ["lib/python3.13/site-packages/nvidia/cusparselt"],
    "nvidia-cuda": ["lib/python3.13/site-packages/nvidia/cuda_nvcc/bin/ptxas"],
    "rest": ["lib/python3.13/site-packages/numpy/__init__.py", "bin/accelerate"],
    "deepspeed": ["share/torch_extensions", "bin/ds_report"],
    "project": ["bin/entrypoint"],
}


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


pull = _load(REPO / "benchmarks" / "pull.py", "pull_bench")
venv_layers = _load(REPO / "docker" / "venv_layers.py", "venv_layers")


@pytest.fixture(scope="module")
def tools(unavailable):
    missing = [t for t in ("docker-registry", "containerd", "ctr", "skopeo") if not shutil.which(t)]
    if missing:
        unavailable(f"{', '.join(missing)} not found: apt-get install {pull.PACKAGES}")
    if os.geteuid() != 0:
        unavailable("containerd's overlay snapshots need root")


def _available_memory() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


REGISTRY_MEMORY = 6e9  # the registry's tmpfs: the zstd blobs


def _by_disk(needs: dict[Path, float]) -> dict[int, tuple[Path, float]]:
    """Bytes needed at once on each disk (st_dev), with a folder to name it by."""
    disks: dict[int, tuple[Path, float]] = {}
    for where, need in needs.items():
        device = where.stat().st_dev
        name, total = disks.get(device, (where, 0.0))
        disks[device] = (name, total + need)
    return disks


def _room(image) -> bool:
    """Pushing, the engine writes the image out under its own tmp folder while skopeo copies
    that stream into a file (the image's size each, at once); pulling, containerd keeps the
    blobs and their unpacked layers under the test's folder. skopeo's file goes to memory when
    there is room beside the registry's (True), else to /var/tmp. Short of disk, say so before
    minutes of pushing."""
    size = int(image.config["Size"])
    in_memory = _available_memory() > REGISTRY_MEMORY + size * 1.05 + 4e9
    root = pull.sh("docker", "info", "--format", "{{.DockerRootDir}}").strip()
    pushing = {Path(root) / "tmp": size} | ({} if in_memory else {Path("/var/tmp"): size})
    pulling = {Path(tempfile.gettempdir()): size * 1.7}
    need = _by_disk(pushing)
    for device, (where, total) in _by_disk(pulling).items():
        need[device] = (where, max(total, need.get(device, (where, 0.0))[1]))
    for where, total in need.values():
        free = shutil.disk_usage(where).free
        if free < total:
            pytest.fail(
                f"{where} has {free / 1e9:.1f} GB free; pushing and pulling {image.tag} "
                f"needs {total / 1e9:.1f} GB there: free some (docker image prune; docker "
                "builder prune --filter type=exec.cachemount, the builds' downloads; docker "
                "builder prune --filter until=24h), then run it again",
                pytrace=False,
            )
    return in_memory


@pytest.fixture(scope="module")
def pushed(image, tools):
    in_memory = _room(image)
    with tempfile.TemporaryDirectory(prefix="pull-test-") as tmp:
        # the blobs in memory: the disk holds containerd's copy, 14 GB, at the same time
        with pull.Registry(Path(tmp), memory=f"{REGISTRY_MEMORY:.0f}") as registry:
            ref = f"{registry.host}/multinode:test"
            skopeo_tmp = Path(tmp) / "skopeo"
            if in_memory:  # skopeo's copy of the image, deleted once pushed
                skopeo_tmp.mkdir()
                size = int(int(image.config["Size"]) * 1.05)
                pull.sh("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(skopeo_tmp))
            try:
                pull.push(image.tag, ref, "zstd", tmpdir=skopeo_tmp if in_memory else None)
            finally:
                if in_memory:
                    subprocess.run(["umount", str(skopeo_tmp)], check=False)
            yield registry, ref, Path(tmp)


def _layer_dirs(node, ref: str) -> list[Path]:
    """The pulled image's layers as containerd unpacked them, bottom to top."""
    info = node.ctr("images", "pull", "--plain-http", "--print-chainid", ref, check=True)
    chain = info.stdout.split("image chain ID: ")[1].split()[0]
    view = node.ctr("snapshots", "view", "--mounts", "layers", chain, check=True).stdout
    # ctr prints containerd's Mount structs as they are: {"Type", "Source", "Options"}
    options = [o for m in json.loads(view) for o in m.get("Options") or m.get("options") or []]
    lower = next(o.split("=", 1)[1] for o in options if o.startswith("lowerdir="))
    return [Path(d) for d in reversed(lower.split(":"))]  # overlayfs lists the top first


def test_containerd_pulls_the_split_image_and_runs_it(pushed, image):
    registry, ref, tmp = pushed
    with pull.Containerd(tmp) as node:
        node.pull(ref)
        dirs = _layer_dirs(node, ref)
        assert len(dirs) == len(image.config["RootFS"]["Layers"]), dirs
        venv = "opt/venv/"
        found = {
            group: [i for i, d in enumerate(dirs) if (d / venv / path).exists()]
            for group, path in MARKERS.items()
        }
        # each group's marker in exactly one layer, the groups in docker/venv_layers.py's order
        assert all(len(where) == 1 for where in found.values()), found
        order = [
            f"{name}-{part}" if name in venv_layers.PARTS else name
            for name, _ in venv_layers.GROUPS
            for part, _ in venv_layers.PARTS.get(name, [("", "")])
        ] + ["lock", "project"]
        assert [found[g][0] for g in order] == sorted(found[g][0] for g in order), found
        assert len({found[g][0] for g in order}) == len(order), found
        for group, paths in MORE.items():
            for path in paths:
                assert (dirs[found[group][0]] / venv / path).exists(), (group, path)
        # above the project: its revision file, and the empty layer WORKDIR leaves
        above = [
            str(p.relative_to(d))
            for d in dirs[found["project"][0] + 1 :]
            for p in d.rglob("*")
            if p.is_file()
        ]
        assert above == ["opt/venv/share/entrypoint/revision"], above
        proc = node.ctr("run", "--rm", ref, "pull-test", "entrypoint", "--version", timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("entrypoint "), proc.stdout


def test_push_short_of_room_says_where_before_copying(image, tools, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    pull.sh("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(small))
    try:
        proc = subprocess.run(
            [str(REPO / "docker" / "push.sh"), "127.0.0.1:1/never:pushed"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "IMAGE": image.tag, "TMPDIR": str(small)},
        )
    finally:
        subprocess.run(["umount", str(small)], check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"push: {small} has 0.0 GB free;"), lines
    assert f"pushing {image.tag} needs" in lines[0] and "set TMPDIR" in lines[0], lines
