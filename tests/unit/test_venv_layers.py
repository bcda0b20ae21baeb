"""docker/venv_layers.py: the lock split into one sub-lock per layer group, nothing lost, nothing
twice, hashes kept (the image installs each sub-lock with --require-hashes)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "docker" / "requirements.lock"
_spec = importlib.util.spec_from_file_location("venv_layers", REPO / "docker" / "venv_layers.py")
venv_layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(venv_layers)


def _pins(text: str) -> list[str]:
    return [m[1] for m in re.finditer(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==", text)]


def test_every_pin_in_exactly_one_group_with_its_hashes():
    text = LOCK.read_text()
    groups = venv_layers.split_lock(text)
    assert [name for name, _ in venv_layers.GROUPS] == list(groups)
    assert all(_pins(sub) for sub in groups.values()), {g: _pins(s) for g, s in groups.items()}
    pins = [p for sub in groups.values() for p in _pins(sub)]
    assert sorted(pins) == sorted(_pins(text))
    # every line of the lock but its header, in one sub-lock: pins, hashes and `# via` notes
    body = [ln for ln in text.splitlines() if not ln.startswith("#")]
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
