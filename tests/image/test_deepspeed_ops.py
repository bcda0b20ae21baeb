"""DeepSpeed's ops in the built image: every op a standard config selects loads prebuilt on
both accelerators the image serves, with no compiler and no build at start; a config that
needs an op the image lacks is refused before launch. A Hugging Face Trainer with
`--deepspeed` and a standard ZeRO-2 AdamW config (seed 003's shape) training with the prebuilt
FusedAdam through `entrypoint run` on CPU workers is tests/compat's `hf_trainer`, on each image.

"No build" is shown, not assumed: DeepSpeed's JIT path (the only one the CPU accelerator has
for the ops it did not install) calls `ninja --version` before it looks for a prebuilt op, so
the tests put a `ninja` first on PATH that answers that and fails on anything else; no
compiler is in the image (test_image.py)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint.doctor import cuda_kernels

from .image_helpers import CUDA, REPO

READ_ONLY = ("--read-only", "--tmpfs", "/tmp")
IMAGE_PATH = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NINJA_STUB = """#!/bin/sh
# torch asks `ninja --version`, then runs `ninja -v` in the op's directory before it loads a
# prebuilt op: allowed only when ninja has nothing to do; anything else would be a build.
real=/opt/venv/bin/ninja
if [ "$1" = --version ]; then exec "$real" --version; fi
if "$real" -n "$@" | grep -q "no work to do"; then exec "$real" "$@"; fi
echo "ninja stub: a build was attempted in $PWD: $*" >&2
exit 99
"""


@pytest.fixture(scope="module")
def no_build(tmp_path_factory) -> tuple[str, ...]:
    """docker run arguments: the ninja stub first on PATH."""
    stub = tmp_path_factory.mktemp("ninja")
    stub.chmod(0o755)
    (stub / "ninja").write_text(NINJA_STUB)
    (stub / "ninja").chmod(0o755)
    return ("-v", f"{stub}:/stub:ro", "-e", f"PATH=/stub:{IMAGE_PATH}")


def _ds_report(image, accelerator: str) -> dict[str, str]:
    out = image.run(
        docker_args=("-e", f"DS_ACCELERATOR={accelerator}"), entrypoint="ds_report"
    ).stdout
    installed = {}
    for line in out.splitlines():
        m = re.match(r"^(\w+) \.+ \[(\w+)\] \.+ \[(\w+)\]", re.sub(r"\x1b\[[0-9;]*m", "", line))
        if m:
            installed[m[1]] = m[2]
    return installed


def test_ds_report_cuda_lists_the_standard_ops_installed(image):
    installed = _ds_report(image, "cuda")
    for op in ("fused_adam", "cpu_adam", "async_io", "pin_memory"):
        assert installed.get(op) == "YES", installed


def test_entrypoint_sees_the_ops_deepspeed_sees(image):
    """The check before launch reads the same record ds_report does, plus the CPU cache."""
    out = image.python(
        "import json, os; from entrypoint.supervise import dsops;"
        "print(json.dumps({k: sorted(v) for k, v in "
        "dsops.installed_ops(dict(os.environ)).items()}))"
    )
    ops = json.loads(out.strip().splitlines()[-1])
    assert {"fused_adam", "cpu_adam", "async_io", "pin_memory"} <= set(ops["cuda"]), ops
    assert {"fused_adam", "cpu_adam", "deepspeed_shm_comm"} <= set(ops["cpu"]), ops


# The CPU accelerator's ops and where each loads from: the prebuilt cache, linked on a read-only
# root, or (cpu_adam, a host-side optimizer DeepSpeed's CUDA accelerator builds with the CPU
# accelerator's builder) the CUDA wheel's own, built once (trainer_side/prebuilt_ops.py, share).
SITE = "/opt/venv/lib/python3.13/site-packages/deepspeed/ops/"
CPU_OPS = {
    "FusedAdamBuilder": "/tmp/entrypoint-1000/torch_extensions/fused_adam/",
    "CPUAdamBuilder": SITE + "adam/cpu_adam_op.",
    "ShareMemCommBuilder": "/tmp/entrypoint-1000/torch_extensions/deepspeed_shm_comm/",
}
PREBUILT = 2  # in TORCH_EXTENSIONS_DIR: fused_adam and deepspeed_shm_comm


@pytest.mark.parametrize("builder", sorted(CPU_OPS))
def test_cpu_accelerator_op_loads_with_no_build_on_a_read_only_root(image, no_build, builder):
    """Straight `python`, no `entrypoint run`: the image's .pth hook (trainer_side/prebuilt_ops.py)
    links the ops where torch can lock them and says so in one line, and has the CPU Adam op
    come from the wheel. (A writable root: tests/image/test_image.py.)"""
    proc = image.run(
        "-c",
        "import time; from deepspeed.ops.op_builder.cpu import " + builder + " as B;"
        "t = time.time(); m = B().load(verbose=False);"
        "print('loaded', m.__file__, 'in', round(time.time() - t, 1))",
        entrypoint="python",
        docker_args=("-e", "DS_ACCELERATOR=cpu", *no_build, *READ_ONLY),
    )
    out = proc.stdout.strip().splitlines()[-1]
    assert out.startswith(f"loaded {CPU_OPS[builder]}"), proc
    assert float(out.split(" in ")[-1]) < 10, out
    assert (
        f"entrypoint: TORCH_EXTENSIONS_DIR=/opt/venv/share/torch_extensions is read-only: its "
        f"{PREBUILT} prebuilt ops are linked into /tmp/entrypoint-1000/torch_extensions"
        in proc.stderr
    ), proc.stderr
    assert "ninja stub" not in proc.stderr, proc.stderr


ZERO2_STEP = """
import json, sys, torch, deepspeed
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "zero_optimization": {"stage": 2}, "steps_per_print": 1000}
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config,
                                               model_parameters=model.parameters())
x, y = torch.randn(4, 8), torch.randn(4, 1)
losses = []
for _ in range(5):
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
inner = getattr(optimizer, "optimizer", optimizer)
print(json.dumps({"optimizer": type(inner).__name__, "losses": losses}))
"""


CPU_ADAM_STEP = """
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
p = torch.nn.Parameter(torch.ones(4))
opt = DeepSpeedCPUAdam([p], lr=0.1)
p.grad = torch.ones(4)
opt.step()
print(opt.ds_opt_adam.__file__, p.data.tolist())
"""


def test_zero_offload_s_cpu_adam_on_the_cpu_accelerator_is_the_wheel_s_and_exits_clean(
    image, no_build
):
    """The optimizer lives until the interpreter exits; its __del__ then calls the op, which
    must still be whole (an op module in sys.modules is emptied first: a TypeError)."""
    proc = image.run(
        "-c",
        CPU_ADAM_STEP,
        entrypoint="python",
        docker_args=("-e", "DS_ACCELERATOR=cpu", *no_build),
    )
    where, weights = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    assert where.startswith(SITE + "adam/cpu_adam_op."), proc
    assert weights == str([0.8999999761581421] * 4), proc
    assert "Traceback" not in proc.stderr and "ninja stub" not in proc.stderr, proc.stderr


def test_zero2_adamw_step_on_cpu_with_no_build(image, no_build):
    """The issue's failure: AdamW on the CPU accelerator selects fused_adam (FusedAdam)."""
    env = (
        "-e",
        "DS_ACCELERATOR=cpu",
        "-e",
        "MASTER_ADDR=127.0.0.1",
        "-e",
        "MASTER_PORT=29511",
        "-e",
        "RANK=0",
        "-e",
        "LOCAL_RANK=0",
        "-e",
        "WORLD_SIZE=1",
    )
    proc = image.run(
        "-c",
        ZERO2_STEP,
        entrypoint="python",
        timeout=300,
        docker_args=(*env, *no_build, *READ_ONLY),
    )
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["optimizer"] == "FusedAdam", got
    assert got["losses"][-1] < got["losses"][0], got
    assert "ninja stub" not in proc.stderr, proc.stderr


def test_zero2_adamw_on_a_read_only_root_through_entrypoint_run(image, no_build):
    """torch takes a lock in the op's directory before it loads a prebuilt op (torch 2.14:
    an flock it opens read-write). On a read-only root `entrypoint run` links the ops into its
    run directory on /tmp, says so, and the step runs with no build."""
    proc = image.run(
        "run",
        "--",
        "python",
        "-c",
        ZERO2_STEP,
        timeout=300,
        docker_args=(
            "-e",
            "DS_ACCELERATOR=cpu",
            "-e",
            "ENTRYPOINT_GPUS_PER_NODE=0",
            *no_build,
            *READ_ONLY,
        ),
    )
    log = proc.stdout + proc.stderr
    assert (
        f"TORCH_EXTENSIONS_DIR=/opt/venv/share/torch_extensions is read-only: its {PREBUILT} "
        "prebuilt ops are linked into /tmp/entrypoint-run/torch_extensions" in log
    ), log
    got = json.loads(re.findall(r'^.*(\{"optimizer".*\})$', log, re.M)[-1])
    assert got["optimizer"] == "FusedAdam", got
    assert got["losses"][-1] < got["losses"][0], got
    assert "ninja stub" not in log, log


AIO_ROUND_TRIP = """
import os, torch
from deepspeed.ops.op_builder import AsyncIOBuilder
aio = AsyncIOBuilder().load(verbose=False)
handle = aio.aio_handle(1024 * 1024, 8, False, True, 1)
data = torch.arange(1 << 20, dtype=torch.float32)
path = "/swap/tensor.bin"
assert handle.sync_pwrite(data, path) == 1
back = torch.empty_like(data)
assert handle.sync_pread(back, path) == 1
print("async_io", aio.__file__, "round trip", bool(torch.equal(data, back)))
"""


def test_async_io_loads_and_round_trips_a_tensor(image, no_build, tmp_path):
    """ZeRO-Infinity's NVMe swapper: DeepSpeed's aio handle writes and reads a tensor (libaio,
    O_DIRECT) on a volume, as it would on the NVMe path of offload_*.nvme_path."""
    swap = tmp_path / "swap"
    swap.mkdir()
    swap.chmod(0o777)
    out = image.run(
        "-c",
        AIO_ROUND_TRIP,
        entrypoint="python",
        docker_args=("-e", "DS_ACCELERATOR=cuda", "-v", f"{swap}:/swap", *no_build, *READ_ONLY),
    ).stdout
    assert "round trip True" in out and "site-packages/deepspeed/ops/aio/" in out, out


def test_run_refuses_a_config_needing_an_op_the_image_lacks(image, tmp_path):
    """NVMe offload on CPU workers: async_io exists for the CUDA accelerator only here."""
    config = tmp_path / "ds_nvme.json"
    config.write_text(
        json.dumps(
            {
                "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                "zero_optimization": {
                    "stage": 3,
                    "offload_param": {"device": "nvme", "nvme_path": "/tmp"},
                },
            }
        )
    )
    tmp_path.chmod(0o755)
    config.chmod(0o644)
    proc = image.run(
        "run",
        "--",
        "python",
        "-c",
        "print('trainer started')",
        "--deepspeed",
        "/cfg/ds_nvme.json",
        check=False,
        docker_args=("-v", f"{tmp_path}:/cfg:ro", "-e", "ENTRYPOINT_GPUS_PER_NODE=0"),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("entrypoint: error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(
        "entrypoint: error: /cfg/ds_nvme.json: zero_optimization.offload_param.device='nvme': "
        "needs DeepSpeed's async_io op for the cpu accelerator"
    ), errors
    assert "trainer started" not in proc.stdout and "Traceback" not in proc.stderr


def _promised() -> tuple[set[int], set[int]]:
    """(cubin archs, PTX archs) docker/build.sh promises for this CUDA line: '9.0+PTX' both."""
    text = (REPO / "docker" / "build.sh").read_text()
    listed = re.search(rf'^ARCHS_CUDA{CUDA}="([^"]+)"', text, re.M)[1].split(";")
    arch = [(int(a.split("+")[0].replace(".", "")), a.endswith("+PTX")) for a in listed]
    return {a for a, _ in arch}, {a for a, ptx in arch if ptx}


@pytest.fixture(scope="module")
def cuda_ops(image, tmp_path_factory) -> list:
    """The image's DeepSpeed .so files that hold GPU code, copied out of it."""
    out = tmp_path_factory.mktemp("ops")
    site = "/opt/venv/lib/python3.13/site-packages/deepspeed"
    found = image.run(site, "-name", "*.so", entrypoint="find").stdout.split()
    copied = []
    for path in found:
        data = image.run(path, entrypoint="base64").stdout
        local = out / path.rsplit("/", 1)[1]
        local.write_bytes(base64.b64decode(data))
        if cuda_kernels.elf_section(local, b".nv_fatbin"):
            copied.append(local)
    return copied


def test_every_prebuilt_cuda_op_has_a_kernel_for_every_promised_architecture(cuda_ops, unavailable):
    """Issue 23: cubins for sm_80, sm_90, sm_100 and sm_120 and compute_90 PTX, listed by
    NVIDIA's cuobjdump (the nvidia-cuda-cuobjdump wheel) and by the entrypoint's own reader,
    which `entrypoint doctor` uses."""
    cuobjdump = shutil.which("cuobjdump") or next(
        (
            str(p)
            for p in Path(sys.prefix).glob("lib/python*/site-packages/nvidia/cu*/bin/cuobjdump")
        ),
        None,
    )
    if cuobjdump is None:
        unavailable("cuobjdump not found: pip install nvidia-cuda-cuobjdump (make dev does)")
    cubins, ptx = _promised()
    assert {80, 90, 100, 120} <= cubins and ptx and max(ptx) >= 90, (cubins, ptx)
    assert any(so.name.startswith("fused_adam_op") for so in cuda_ops), cuda_ops
    for so in cuda_ops:
        listing = subprocess.run(
            [cuobjdump, "--list-elf", "--list-ptx", str(so)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        elf = {int(a) for a in re.findall(r"^ELF file.*\.sm_(\d+)\.cubin", listing, re.M)}
        ptx_seen = {int(a) for a in re.findall(r"^PTX file.*\.sm_(\d+)\.ptx", listing, re.M)}
        assert (elf, ptx_seen) == (cubins, ptx), (so.name, listing)
        ours = cuda_kernels.fatbin_archs(cuda_kernels.elf_section(so, b".nv_fatbin"))
        assert ours == (tuple(sorted(cubins)), tuple(sorted(ptx))), (so.name, ours)


def test_doctor_says_what_the_ops_hold(image):
    """On a node without a GPU doctor lists the ops' architectures (no verdict without GPUs)."""
    report = json.loads(image.run("doctor", "--json", check=False).stdout)
    ops = {k["op"]: k for k in report["kernels"]}
    cubins, ptx = _promised()
    assert ops["fused_adam_op"]["cubins"] == [f"sm_{a}" for a in sorted(cubins)], ops
    assert ops["fused_adam_op"]["ptx"] == [f"compute_{a}" for a in sorted(ptx)], ops
    assert ops["fused_adam_op"]["gpus"] == {}, ops
