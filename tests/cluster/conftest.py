"""Fixtures for the cluster tests: a Docker engine (the SDK) and the built image; without them
they skip, or fail under CI (tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

IMAGE = os.environ.get("IMAGE", "multinode:dev")


@pytest.fixture(scope="session")
def docker_client(unavailable):
    try:
        import docker

        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as err:  # noqa: BLE001 - ImportError, DockerException, connection errors
        unavailable(f"no Docker engine answers (docker SDK): {err}")
    return client


@pytest.fixture(scope="session")
def image(docker_client, unavailable) -> str:
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(IMAGE)
    except ImageNotFound:
        unavailable(f"image {IMAGE} is not built: run make image")
    return IMAGE
