"""Build DeepSpeed's ops at image build time, for any x86-64-v3 CPU and sm_80/sm_90 GPU.

    python deepspeed_ops.py wheel SDIST_DIR WHEEL_DIR   # setup.py bdist_wheel, ops compiled in
    python deepspeed_ops.py check OP...                 # fail unless the wheel installed OP...
    python deepspeed_ops.py jit EXTENSIONS_DIR          # the CPU accelerator's ops, prebuilt
    python deepspeed_ops.py times DIR                   # the slowest compiles in DIR's ninja logs

Why not plain `pip wheel`: DeepSpeed compiles its CPU ops with -march=native and
picks AVX-512 or AVX2 from the build machine's CPU, so an image built on one machine
would die with SIGILL on a node with an older CPU. Both choices are pinned here
(DS_CPU_ARCH, default -march=x86-64-v3: AVX2 and FMA, every x86 server CPU since
2013-2015; DS_SIMD_WIDTH, default -D__AVX256__).

Why `jit`: setup.py builds one accelerator's ops only (cuda, here), and DeepSpeed uses
installed ops only when the accelerator matches; with DS_ACCELERATOR=cpu (the CPU runs)
it JIT-builds shm_comm, cpu_adam (ZeRO-Offload) and fused_adam (Adam/AdamW without
offload) at start. Not cpu_adam where the CUDA wheel holds it: DeepSpeed's CUDA accelerator
builds it with the CPU accelerator's own builder and the same pinned flags, and the image's
hook has the CPU accelerator load the wheel's (entrypoint/trainer_side/prebuilt_ops.py,
share). The two accelerators' other ops share module names (deepspeed.ops.adam.fused_adam_op
is the CUDA kernel or the CPU loop), so the CPU ones cannot be installed beside the CUDA ones.
Not async_io: DeepSpeed's JIT path first compiles a test program against libaio, which needs a
compiler at every start, so NVMe offload is served on the CUDA accelerator only. The others
are built into EXTENSIONS_DIR (TORCH_EXTENSIONS_DIR in the image) with their objects, ninja
files and ninja logs, and no build lock: at load torch takes the lock (torch 2.14: an flock on
`lock`, which it creates; 2.13 and before: a lock file it creates and removes) and runs ninja,
which finds nothing to do, so no compiler is needed (the image has none;
TORCH_DONT_CHECK_COMPILER_ABI=1 quiets torch's warning about it). Taking the lock needs
the op's directory writable: the image makes it group-writable for its user, and where the
root filesystem is read-only `entrypoint run` links the ops into a writable directory
(entrypoint/trainer_side/prebuilt_ops.py, writable_extensions). The ops build side by side,
each in a process of its own (each has two source files: one op alone would leave a core
idle).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import runpy
import subprocess
import sys
from pathlib import Path

CPU_ARCH = os.environ.get("DS_CPU_ARCH", "-march=x86-64-v3")
SIMD_WIDTH = os.environ.get("DS_SIMD_WIDTH", "-D__AVX256__")


def pin_cpu_flags(*builders: type) -> None:
    for builder in builders:
        for cls in builder.__mro__:
            if "cpu_arch" in cls.__dict__:
                cls.cpu_arch = lambda self: CPU_ARCH
            if "simd_width" in cls.__dict__:
                cls.simd_width = lambda self: SIMD_WIDTH


def wheel(sdist: str, out: str) -> None:
    os.chdir(sdist)
    sys.path.insert(0, sdist)
    from op_builder.all_ops import ALL_OPS

    pin_cpu_flags(*(type(b) for b in ALL_OPS.values()))
    sys.argv = ["setup.py", "bdist_wheel", "--dist-dir", out]
    runpy.run_path("setup.py", run_name="__main__")


def check(*ops: str) -> None:
    # setup.py skips a requested op that is not compatible (a missing libaio-dev, say)
    # with a warning only; the image must not ship without it.
    from deepspeed.git_version_info import accelerator_name, installed_ops

    missing = [op for op in ops if not installed_ops.get(op)]
    if missing:
        sys.exit(f"deepspeed wheel ({accelerator_name}): ops not installed: {', '.join(missing)}")
    print(f"deepspeed wheel ({accelerator_name}): installed {', '.join(ops)}")


# builder class -> op name. cpu_adam is also one of the host-side optimizers that DeepSpeed's
# CUDA accelerator builds with this same builder (entrypoint/trainer_side/prebuilt_ops.py,
# SHARED_CPU_OPS): where the wheel holds it, the CPU accelerator loads the wheel's.
CPU_BUILDERS = {
    "ShareMemCommBuilder": "deepspeed_shm_comm",
    "CPUAdamBuilder": "cpu_adam",
    "FusedAdamBuilder": "fused_adam",
}
SHARED = ("cpu_adam",)


def wheel_ops() -> dict[str, object]:
    """The installed DeepSpeed wheel's record: accelerator_name, installed_ops (read, not
    imported: importing deepspeed imports torch)."""
    spec = importlib.util.find_spec("deepspeed")
    assert spec and spec.submodule_search_locations, "deepspeed is not installed"
    path = Path(next(iter(spec.submodule_search_locations))) / "git_version_info_installed.py"
    record: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                record[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return record


def jit(extensions_dir: str) -> None:
    """Each CPU op built by a process of its own, all at once (but those the CUDA wheel holds
    for both accelerators); fails if any fails."""
    record = wheel_ops()
    installed = record.get("installed_ops") or {}
    names = []
    for name, op in CPU_BUILDERS.items():
        if op in SHARED and record.get("accelerator_name") != "cpu" and installed.get(op):
            print(
                f"{op}: the {record['accelerator_name']} wheel's, shared with the CPU accelerator"
            )
        else:
            names.append(name)
    started = [
        subprocess.Popen([sys.executable, __file__, "jit-one", extensions_dir, name])
        for name in names
    ]
    failed = [name for name, proc in zip(names, started) if proc.wait() != 0]
    if failed:
        sys.exit(f"prebuilding the CPU ops failed: {', '.join(failed)} (their errors above)")


def jit_one(extensions_dir: str, class_name: str) -> None:
    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir
    from deepspeed.ops.op_builder import cpu

    builder_class = getattr(cpu, class_name)
    pin_cpu_flags(builder_class)
    builder = builder_class()
    builder.jit_load(verbose=False)
    op_dir = Path(extensions_dir) / builder.name
    (op_dir / "lock").unlink(missing_ok=True)  # torch 2.14 leaves its flock file
    dry = subprocess.run(["ninja", "-n", "-C", str(op_dir)], capture_output=True, text=True)
    if "no work to do" not in dry.stdout:
        sys.exit(f"{op_dir}: ninja would build again at load:\n{dry.stdout}{dry.stderr}")
    print(f"prebuilt {builder.name} ({CPU_ARCH} {SIMD_WIDTH}) in {op_dir}")


def times(root: str, top: int = 8) -> None:
    """The slowest compiles that ninja logged under root (.ninja_log: start and end in ms)."""
    rows = []
    for log in Path(root).rglob(".ninja_log"):
        for line in log.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
                rows.append(((int(fields[1]) - int(fields[0])) / 1000, fields[3]))
    for seconds, target in sorted(rows, reverse=True)[:top]:
        print(f"compile {seconds:6.1f} s  {Path(target).name}")


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"wheel": wheel, "check": check, "jit": jit, "jit-one": jit_one, "times": times}[command](*args)
