"""The built image, run in real containers: what every node of a job relies on."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from .image_helpers import CUDA, LOCK_IN_IMAGE, REPO

# A read-only root filesystem with a writable /tmp, as platforms that harden pods run it.
READ_ONLY = ("--read-only", "--tmpfs", "/tmp")


def test_entrypoint_version_runs(image):
    version = re.search(r'__version__ = "([^"]+)"', (REPO / "entrypoint/__init__.py").read_text())[
        1
    ]
    out = image.run("--version").stdout
    assert out.strip() == f"entrypoint {version}"


def test_entrypoint_is_tini_then_the_cli(image):
    config = image.config["Config"]
    assert config["Entrypoint"] == ["tini", "--", "entrypoint"]
    assert config["Cmd"] == ["run"]


def test_tini_is_pid_1_and_reaps(image):
    out = image.run("--", "sh", "-c", "tr '\\0' ' ' </proc/1/cmdline", entrypoint="tini").stdout
    assert out.startswith("tini")


def test_frameworks_import_at_locked_versions(image, locked):
    out = image.python(
        "import json, torch, jax, jaxlib, deepspeed, accelerate;"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,"
        " 'jax': jax.__version__, 'jaxlib': jaxlib.__version__,"
        " 'deepspeed': deepspeed.__version__, 'accelerate': accelerate.__version__}))",
        docker_args=("-e", "JAX_PLATFORMS=cpu"),
    )
    got = json.loads(out.strip().splitlines()[-1])
    assert got["torch"].split("+")[0] == locked["torch"]
    assert got["cuda"].startswith(f"{CUDA}.")
    assert got["jax"] == locked["jax"]
    assert got["deepspeed"].split("+")[0] == locked["deepspeed"]
    assert got["accelerate"] == locked["accelerate"]


def test_another_program_runs_as_given_through_the_images_entrypoint(image, locked):
    """`docker run --rm IMAGE python -c ...` as a user types it: no --entrypoint, the image's
    ENTRYPOINT hands the program over with one line on stderr."""
    proc = image.run(
        "python",
        "-c",
        "import torch, jax, deepspeed;"
        "print(torch.__version__, torch.version.cuda, jax.__version__)",
    )
    # the last line: importing DeepSpeed logs its accelerator choice to stdout first
    torch_version, cuda, jax_version = proc.stdout.splitlines()[-1].split()
    assert torch_version.split("+")[0] == locked["torch"], proc.stdout
    assert cuda.startswith(f"{CUDA}."), proc.stdout
    assert jax_version == locked["jax"], proc.stdout
    assert proc.stderr.startswith("entrypoint: python is not an entrypoint command"), proc.stderr


def test_pip_check_is_clean(image):
    assert "No broken requirements" in image.run("check", entrypoint="pip").stdout


def _ds_report(image, accelerator: str) -> dict[str, tuple[str, str]]:
    out = image.run(
        docker_args=("-e", f"DS_ACCELERATOR={accelerator}"), entrypoint="ds_report"
    ).stdout
    ops = {}
    for line in out.splitlines():
        m = re.match(r"^(\w+) \.+ \[(\w+)\] \.+ \[(\w+)\]", re.sub(r"\x1b\[[0-9;]*m", "", line))
        if m:
            ops[m[1]] = (m[2], m[3])
    return ops


def test_ds_report_shows_fused_adam_and_cpu_adam_installed(image):
    ops = _ds_report(image, "cuda")
    assert ops["fused_adam"][0] == "YES", ops
    assert ops["cpu_adam"][0] == "YES", ops


@pytest.mark.parametrize(
    ("builder", "where"),
    [
        ("ShareMemCommBuilder", "/opt/venv/share/torch_extensions/"),
        ("CPUAdamBuilder", "/opt/venv/lib/python3.13/site-packages/deepspeed/ops/adam/"),
    ],
)
def test_cpu_accelerator_ops_load_prebuilt_without_a_compiler(image, builder, where):
    # DS_ACCELERATOR=cpu (the CPU runs) loads these through the JIT path; the image
    # carries them prebuilt, and has no compiler to build them with. Where they are: a
    # writable root (a read-only one: tests/image/test_deepspeed_ops.py); CPU Adam is the
    # CUDA wheel's own, built once for both accelerators (trainer_side/prebuilt_ops.py).
    image.run("-c", "command -v c++ g++ gcc nvcc && exit 1; exit 0", entrypoint="sh")
    out = image.python(
        "import time; from deepspeed.ops.op_builder.cpu import " + builder + " as B;"
        "t = time.time(); m = B().load(verbose=False);"
        "print(m.__file__, 'loaded in', round(time.time() - t, 1))",
        docker_args=("-e", "DS_ACCELERATOR=cpu"),
    )
    assert out.startswith(where), out
    seconds = float(out.split("loaded in")[-1])
    assert seconds < 10, out


def test_runs_as_non_root(image):
    assert image.config["Config"]["User"] == "1000:0"
    assert image.run("-u", entrypoint="id").stdout.strip() == "1000"


def test_read_only_root_with_writable_tmp(image):
    image.run("--version", docker_args=READ_ONLY)
    out = image.python(
        "import torch, jax.numpy as jnp;"
        "print(float((torch.ones(3) @ torch.ones(3))), float(jnp.arange(4.0).sum()))",
        docker_args=("-e", "JAX_PLATFORMS=cpu", *READ_ONLY),
    )
    assert out.split() == ["3.0", "6.0"]


GLOO_LEFT_OPEN = """
import torch, torch.distributed as dist
destroy = dist.destroy_process_group
def destroyed(*args, **kwargs):
    print("destroyed at exit", flush=True)
    destroy(*args, **kwargs)
dist.destroy_process_group = destroyed
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
print("trained", flush=True)
"""


def test_plain_python_with_a_gloo_group_left_open_has_it_settled_at_exit(image):
    """`python` with no `entrypoint run` and no site hook (--entrypoint python): the image's .pth
    file destroys the group the trainer left open, after the trainer's code, before the
    interpreter is torn down (trainer_side/exit_guard.py)."""
    out = image.python(GLOO_LEFT_OPEN)
    assert out.splitlines()[-2:] == ["trained", "destroyed at exit"], out


def test_lock_hash_in_label_and_file(image, lock_sha256):
    assert image.labels["io.multinode.lock.sha256"] == lock_sha256
    assert image.run(LOCK_IN_IMAGE, entrypoint="cat").stdout.strip() == lock_sha256


def test_oci_labels(image):
    for key in ("source", "revision", "version", "created"):
        assert image.labels.get(f"org.opencontainers.image.{key}"), key


def test_nvidia_container_toolkit_variables(image):
    env = dict(e.split("=", 1) for e in image.config["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert "JAX_PLATFORMS" not in env


def test_no_compiler_and_no_package_caches(image):
    out = image.run(
        "-c",
        "ls /usr/bin | grep -E '^(gcc|g\\+\\+|cc|c\\+\\+|nvcc)(-[0-9]+)?$';"
        "du -sk /root/.cache /var/cache/apt/archives/*.deb /var/lib/apt/lists/*_Packages* "
        "2>/dev/null; true",
        entrypoint="sh",
        docker_args=("-u", "0"),
    ).stdout
    assert out.strip() == "", out


def test_base_has_the_official_slim_package_set(image, docker):
    """Pulled or built offline, the base holds debian:trixie-slim's packages, no more, no less."""
    expected = {
        line.strip()
        for line in (REPO / "docker/base/packages.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    base = image.labels["org.opencontainers.image.base.name"]
    listing = ["dpkg-query", "-W", "-f", "${Package}\\n"]
    proc = subprocess.run(
        [docker, "run", "--rm", "--entrypoint", listing[0], base, *listing[1:]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"base {base}: {proc.stderr}"
    assert set(proc.stdout.split()) == expected
    in_image = set(image.run(*listing[1:], entrypoint=listing[0]).stdout.split())
    assert expected <= in_image
    assert not {
        p
        for p in in_image
        if p.startswith(("gcc", "g++", "cpp-", "nvidia-cuda", "libcuda")) and p != "gcc-14-base"
    }


def test_a_driver_older_than_the_images_cuda_is_refused_before_the_trainer(image):
    """Issue 33: the node's driver against the image's own CUDA (its torch's), checked before any
    trainer starts. The GPUs and the driver are NVIDIA's library stand-in (tests/stand_in), as no
    GPU exists here; the image, its torch and `entrypoint run` are the real ones."""
    cuda = image.python("import torch; print(torch.version.cuda)").split()[-1]
    stand_in = str(REPO / "tests" / "stand_in")
    proc = image.run(
        "run", "--", "python", "-c", "print('the trainer', 'started')",
        docker_args=(
            "-v", f"{stand_in}:/stand_in:ro", "-e", "PYTHONPATH=/stand_in",
            "-e", "STAND_IN_NVML_DIR=/tmp", "-e", "STAND_IN_NVML_DRIVER=470.82.01,11040",
        ),
        check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "the trainer started" not in out, out
    assert (
        f"NVIDIA driver 470.82.01: runs CUDA up to 11.4, older than this image's CUDA {cuda} "
        f"(torch's). install driver {'525.60.13' if cuda.startswith('12.') else '580.65.06'}"
    ) in out, out
    assert "Traceback" not in out, out
