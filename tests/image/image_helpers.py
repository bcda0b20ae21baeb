"""Constants and helpers shared by the image tests (a unique module name, unlike conftest)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The CUDA line under test (`make test CUDA=13`: the CUDA 13 image, multinode:dev-cu13).
CUDA = os.environ.get("CUDA", "12")
LINE = "" if CUDA == "12" else f"-cu{CUDA}"
IMAGE = os.environ.get("IMAGE", f"multinode:dev{LINE}")
LOCK = REPO / "docker" / f"requirements{LINE}.lock"
LOCK_IN_IMAGE = "/etc/entrypoint/lock.sha256"


def _docker_client() -> str:
    """A client whose `docker build` is BuildKit (see docker/build.sh)."""
    if os.environ.get("DOCKER"):
        return os.environ["DOCKER"]
    if os.path.exists("/usr/bin/docker"):
        return "/usr/bin/docker"
    return shutil.which("docker") or "docker"


DOCKER = _docker_client()


@dataclass(frozen=True)
class Image:
    """The built image, and small helpers to run it."""

    tag: str
    config: dict

    @property
    def labels(self) -> dict[str, str]:
        return self.config["Config"].get("Labels") or {}

    def run(
        self,
        *args: str,
        entrypoint: str | None = None,
        docker_args: tuple[str, ...] = (),
        timeout: float = 300,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        cmd = [DOCKER, "run", "--rm", *docker_args]
        if entrypoint is not None:
            cmd += ["--entrypoint", entrypoint]
        cmd += [self.tag, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            pytest.fail(
                f"{' '.join(cmd)}\nexit {proc.returncode}\nstdout:\n{proc.stdout}\n"
                f"stderr:\n{proc.stderr}",
                pytrace=False,
            )
        return proc

    def python(self, code: str, *, docker_args: tuple[str, ...] = (), **kw) -> str:
        return self.run("-c", code, entrypoint="python", docker_args=docker_args, **kw).stdout
