"""The two documented ways to add a user's code: a FROM image, or a mount at run time."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from .image_helpers import CUDA, DOCKER

USER_DOCKERFILE = """\
ARG IMAGE
FROM ${IMAGE}
USER root
COPY mytrainer /src/mytrainer
# The lock's pins as constraints: torch, NCCL and friends cannot drift.
RUN pip install --no-cache-dir -c /etc/entrypoint/constraints.txt /src/mytrainer \\
    --no-index --no-build-isolation
USER 1000:0
"""

PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "mytrainer"
version = "0.1"
dependencies = ["torch", "numpy"]
"""


@pytest.fixture(scope="module")
def extended(image, tmp_path_factory):
    """A FROM image adding a small pure-Python package, built with BuildKit."""
    ctx = tmp_path_factory.mktemp("extend")
    (ctx / "Dockerfile").write_text(USER_DOCKERFILE)
    pkg = ctx / "mytrainer"
    (pkg / "mytrainer").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "mytrainer" / "__init__.py").write_text(
        "def hello():\n    return 'hello from mytrainer'\n"
    )
    tag = f"{image.tag.rsplit(':', 1)[0]}-extended-test:latest"
    proc = subprocess.run(
        [
            DOCKER,
            "build",
            "--progress=plain",
            "--build-arg",
            f"IMAGE={image.tag}",
            "-t",
            tag,
            str(ctx),
        ],
        capture_output=True,
        text=True,
        env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"},
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield tag
    subprocess.run([DOCKER, "rmi", "-f", tag], capture_output=True, check=False)


def test_from_image_adds_a_package_without_moving_the_pins(image, extended):
    probe = (
        "import mytrainer, torch, importlib.metadata as md;"
        "print(mytrainer.hello(), torch.__version__, md.version('nvidia-nccl-cu{CUDA}'))"
    ).replace("{CUDA}", CUDA)
    base_probe = (
        "import torch, importlib.metadata as md;"
        " print(torch.__version__, md.version('nvidia-nccl-cu{CUDA}'))"
    ).replace("{CUDA}", CUDA)
    base = subprocess.run(
        [DOCKER, "run", "--rm", "--entrypoint", "python", image.tag, "-c", base_probe],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out = subprocess.run(
        [DOCKER, "run", "--rm", "--entrypoint", "python", extended, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[:3] == ["hello", "from", "mytrainer"]
    assert out[3:] == base
    check = subprocess.run(
        [DOCKER, "run", "--rm", "--entrypoint", "pip", extended, "check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout


def test_code_mounted_at_run_time(image, tmp_path):
    (tmp_path / "train.py").write_text(
        textwrap.dedent("""\
        import os, torch
        print("trained", float(torch.ones(4).sum()), os.getuid())
        """)
    )
    tmp_path.chmod(0o755)
    (tmp_path / "train.py").chmod(0o644)
    out = image.run(
        "run",
        "--",
        "python",
        "/workspace/train.py",
        docker_args=(
            "--read-only",
            "--tmpfs",
            "/tmp",
            "-v",
            f"{tmp_path}:/workspace:ro",
            "-e",
            "JAX_PLATFORMS=cpu",
        ),
    ).stdout
    assert "trained 4.0 1000" in out


def test_accelerates_flags_are_all_known(image):
    """entrypoint.plan.launch_lines reads an `accelerate launch` line with its list of the
    options that take no value: checked against the image's accelerate's own parser, so that a
    new accelerate flag does not swallow the script's name."""
    from entrypoint.plan import launch_lines

    out = image.python(
        "import argparse, json\n"
        "from accelerate.commands.launch import launch_command_parser\n"
        "flags = sorted(max(a.option_strings, key=len).lstrip('-').replace('_', '-')\n"
        "    for a in launch_command_parser()._actions\n"
        "    if a.option_strings and a.nargs == 0 and not isinstance(a, argparse._HelpAction))\n"
        "print(json.dumps(flags))"
    )
    assert set(json.loads(out.strip().splitlines()[-1])) == launch_lines.ACCELERATE_FLAGS


def test_deepspeeds_flags_are_all_known(image):
    """The same for DeepSpeed's launcher (`deepspeed ...`): its parser, as the image has it."""
    from entrypoint.plan import launch_lines

    out = image.python(
        "import argparse, json\n"
        "from deepspeed.launcher import runner\n"
        "seen = []\n"
        "def grab(self, args=None, namespace=None):\n"
        "    seen.append(self)\n"
        "    raise SystemExit(0)\n"
        "argparse.ArgumentParser.parse_args = grab\n"
        "try:\n"
        "    runner.parse_args([])\n"
        "except SystemExit:\n"
        "    pass\n"
        "flags = sorted(max(a.option_strings, key=len).lstrip('-').replace('_', '-')\n"
        "    for a in seen[0]._actions\n"
        "    if a.option_strings and a.nargs == 0 and not isinstance(a, argparse._HelpAction))\n"
        "print(json.dumps(flags))"
    )
    assert set(json.loads(out.strip().splitlines()[-1])) == launch_lines.DEEPSPEED_FLAGS
