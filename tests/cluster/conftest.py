"""Fixtures for the cluster tests: a Docker engine and the built image.

As in tests/image/conftest.py: outside CI a missing engine or image skips them with the reason;
under CI (CI=true) it fails them, so a broken build can never pass as "skipped".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

IMAGE = os.environ.get("IMAGE", "multinode:dev")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


def _unavailable(why: str):
    if IN_CI:
        pytest.fail(f"{why} (CI=true: cluster tests must run, not skip)", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def docker_client():
    try:
        import docker

        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as err:  # noqa: BLE001 - ImportError, DockerException, connection errors
        _unavailable(f"no Docker engine answers (docker SDK): {err}")
    return client


@pytest.fixture(scope="session")
def image(docker_client) -> str:
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(IMAGE)
    except ImageNotFound:
        _unavailable(f"image {IMAGE} is not built: run make image")
    return IMAGE
