"""The compatibility suite runs in the cluster tests' setting: a Docker engine (the SDK) and the
built image, the same fixtures (tests/cluster/conftest.py); without them it skips, or fails
under CI (tests/conftest.py)."""

from cluster.conftest import IMAGE, docker_client, image  # noqa: F401 - fixtures shared

__all__ = ["IMAGE", "docker_client", "image"]
