"""Fixtures for the tests that run the built image in real containers.

They need a Docker engine and the image (`make image`). Outside CI a missing engine
or image skips them with the reason; under CI (CI=true) it fails them, so a broken
build can never pass as "skipped".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .image_helpers import DOCKER, IMAGE, IN_CI, LOCK, Image


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.image)


def _unavailable(why: str):
    if IN_CI:
        pytest.fail(f"{why} (CI=true: image tests must run, not skip)", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def docker() -> str:
    try:
        subprocess.run([DOCKER, "info"], capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        _unavailable(f"no Docker engine answers {DOCKER} info: {err}")
    return DOCKER


@pytest.fixture(scope="session")
def image(docker) -> Image:
    proc = subprocess.run([docker, "image", "inspect", IMAGE], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        _unavailable(f"image {IMAGE} is not built: run make image")
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
