"""docker/venv_layers.py: the lock split into one sub-lock per layer group, nothing lost, nothing
twice, hashes kept (the image installs each sub-lock with --require-hashes)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("venv_layers", REPO / "docker" / "venv_layers.py")
venv_layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(venv_layers)


def _pins(text: str) -> list[str]:
    return [m[1] for m in re.finditer(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==", text)]


@pytest.mark.parametrize(
    "lock", ["requirements.lock", "requirements-arm64.lock", "requirements-cu13.lock",
             "requirements-cu13-arm64.lock"],
)  # fmt: skip
def test_every_pin_in_exactly_one_group_with_its_hashes(lock):
    text = (REPO / "docker" / lock).read_text()
    groups = venv_layers.split_lock(text)
    assert [name for name, _ in venv_layers.GROUPS] == list(groups)
    assert all(_pins(sub) for sub in groups.values()), {g: _pins(s) for g, s in groups.items()}
    pins = [p for sub in groups.values() for p in _pins(sub)]
    assert sorted(pins) == sorted(_pins(text))
    # every line of the lock but its comments, in one sub-lock: pins and hashes
    body = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    assert sorted(ln for sub in groups.values() for ln in sub.splitlines()) == sorted(body)


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("nvidia-nccl-cu12", "nvidia"),
        ("nvidia-cudnn-cu13", "nvidia"),
        ("cuda-bindings", "nvidia"),
        ("nvidia-ml-py", "rest"),  # pynvml: no CUDA library
        ("torch", "torch"),
        ("triton", "torch"),
        ("torchvision", "rest"),
        ("jax", "jax"),
        ("jaxlib", "jax"),
        ("jax-cuda12-plugin", "jax"),
        ("jax_cuda13_pjrt", "jax"),
        ("deepspeed", "deepspeed"),
        ("transformers", "rest"),
        ("numpy", "rest"),
    ],
)
def test_group_of(name, group):
    assert venv_layers.group_of(name) == group


SITE = "/opt/venv/lib/python3.13/site-packages/"


@pytest.mark.parametrize(
    ("path", "part"),
    [
        (SITE + "nvidia/cudnn/lib/libcudnn.so.9", "cudnn"),
        (SITE + "nvidia_cudnn_cu12-9.10.2.21.dist-info/RECORD", "cudnn"),
        (SITE + "nvidia/cublas/lib/libcublasLt.so.12", "cublas"),
        (SITE + "nvidia/nccl/lib/libnccl.so.2", "nccl"),
        (SITE + "nvidia/nvshmem/lib/libnvshmem_host.so.3", "nccl"),
        (SITE + "nvidia_nvshmem_cu12-3.4.5.dist-info/METADATA", "nccl"),
        (SITE + "nvidia/cusparselt/lib/libcusparseLt.so.0", "math"),
        (SITE + "nvidia/cufft/lib/libcufft.so.11", "math"),
        (SITE + "nvidia/cuda_runtime/lib/libcudart.so.12", "cuda"),
        (SITE + "nvidia/cuda_nvcc/bin/ptxas", "cuda"),
        (SITE + "nvidia/__init__.py", "cuda"),
        (SITE + "cuda/bindings/driver.py", "cuda"),
        ("/opt/venv/bin/something", "cuda"),
        # CUDA 13: the toolkit's wheels share nvidia/cu13/
        (SITE + "nvidia/cu13/lib/libcublasLt.so.13", "cublas"),
        (SITE + "nvidia/cu13/include/cublas_v2.h", "cublas"),
        (SITE + "nvidia_cublas-13.1.1.3.dist-info/RECORD", "cublas"),
        (SITE + "nvidia/cu13/lib/libcusparse.so.12", "math"),
        (SITE + "nvidia/cu13/lib/libcufft.so.12", "math"),
        (SITE + "nvidia_curand-10.4.0.35.dist-info/METADATA", "math"),
        (SITE + "nvidia_cudnn_cu13-9.24.0.43.dist-info/RECORD", "cudnn"),
        (SITE + "nvidia_nccl_cu13-2.30.7.dist-info/RECORD", "nccl"),
        (SITE + "nvidia/cu13/lib/libcudart.so.13", "cuda"),
        (SITE + "nvidia/cu13/bin/nvcc", "cuda"),
        (SITE + "nvidia/cu13/lib/libnvJitLink.so.13", "cuda"),
    ],
)
def test_the_cuda_wheels_split_into_layers_by_library(path, part):
    assert venv_layers.part_of("nvidia", path) == part


def test_split_parts_links_every_file_into_one_part(tmp_path):
    out = tmp_path / "out"
    files = [
        "nvidia/cudnn/lib/a.so",
        "nvidia/cublas/lib/b.so",
        "nvidia/nccl/lib/c.so",
        "nvidia/cufft/lib/d.so",
        "nvidia/cuda_runtime/lib/e.so",
    ]
    for name in files:
        path = out / SITE.strip("/") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
    (out / SITE.strip("/") / "nvidia/cudnn/lib/a.so.9").symlink_to("a.so")
    venv_layers.cmd_split_parts("nvidia", str(out), str(tmp_path / "parts"))
    linked = sorted(
        str(p.relative_to(tmp_path / "parts"))
        for p in (tmp_path / "parts").rglob("*")
        if p.is_file() or p.is_symlink()
    )
    assert len(linked) == len(files) + 1, linked
    assert (tmp_path / "parts/cudnn" / SITE.strip("/") / "nvidia/cudnn/lib/a.so.9").is_symlink()
    assert (out / SITE.strip("/") / "nvidia/cudnn/lib/a.so").exists()  # OUT stays whole


def test_the_cuda_lines_share_the_rest_stage():
    """A sub-lock is its stage's cache key: where the CUDA 12 and 13 locks pin the same wheels
    (everything but CUDA, torch and JAX), the CUDA 13 image builds no stage of its own."""
    cu12, cu13 = (venv_layers.split_lock((REPO / "docker" / lock).read_text())
                  for lock in ("requirements.lock", "requirements-cu13.lock"))  # fmt: skip
    assert cu12["rest"] == cu13["rest"]
    assert cu12["torch"] != cu13["torch"]
