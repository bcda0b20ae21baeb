"""Fixtures for the tests that run the built image in real containers. They need a Docker
engine and the image (`make image`); without them they skip, or fail under CI
(tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from .image_helpers import DOCKER, IMAGE, LOCK, Image


@pytest.fixture(scope="session")
def docker(unavailable) -> str:
    try:
        subprocess.run([DOCKER, "info"], capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        unavailable(f"no Docker engine answers {DOCKER} info: {err}")
    return DOCKER


@pytest.fixture(scope="session")
def image(docker, unavailable) -> Image:
    proc = subprocess.run(
        [docker, "image", "inspect", IMAGE], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        unavailable(f"image {IMAGE} is not built: run make image")
    return Image(IMAGE, json.loads(proc.stdout)[0])


@pytest.fixture(scope="session")
def lock_sha256() -> str:
    import hashlib

    return hashlib.sha256(LOCK.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def locked() -> dict[str, str]:
    """name -> version for every package in docker/requirements.lock."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line[:1].isalnum() and "==" in line:
            name, _, version = line.split(" ")[0].partition("==")
            pins[name.lower()] = version
    return pins
