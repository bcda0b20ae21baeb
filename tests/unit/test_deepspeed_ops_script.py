"""docker/deepspeed_ops.py, the image build's DeepSpeed step, on stand-ins: the compile-time
report read from ninja's logs, and the CPU ops built by one process each, a failure in any one
failing the step by name (the real build: tests/image/test_deepspeed_ops.py, on the image)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docker" / "deepspeed_ops.py"


def test_times_lists_the_slowest_compiles_of_every_ninja_log(tmp_path):
    logs = {"a": [(0, 51_200, "x/aio.o"), (10, 900, "a.so")], "b": [(0, 3_000, "b.o")]}
    for op, rows in logs.items():
        (tmp_path / op).mkdir()
        log = "# ninja log v7\n" + "".join(f"{s}\t{e}\t0\t{t}\tabc\n" for s, e, t in rows)
        (tmp_path / op / ".ninja_log").write_text(log)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "times", str(tmp_path)], capture_output=True, text=True
    )
    assert out.stdout.splitlines() == [
        "compile   51.2 s  aio.o",
        "compile    3.0 s  b.o",
        "compile    0.9 s  a.so",
    ]


def _stand_in_deepspeed(root: Path, wheel: str, installed: dict) -> dict[str, str]:
    """A stand-in deepspeed: the wheel's record, and deepspeed.ops.op_builder.cpu whose
    builders note their process and write their op, the CPU Adam one failing. `ninja -n` is a
    script that always has nothing to do. Returns the environment to run the script in."""
    pkg = root / "deepspeed" / "ops" / "op_builder"
    pkg.mkdir(parents=True)
    for d in (root / "deepspeed", root / "deepspeed" / "ops", pkg):
        (d / "__init__.py").write_text("")
    (root / "deepspeed" / "git_version_info_installed.py").write_text(
        f"installed_ops = {installed!r}\naccelerator_name = {wheel!r}\n"
    )
    (pkg / "cpu.py").write_text(
        textwrap.dedent(
            """
            import os
            from pathlib import Path

            class _Builder:
                def cpu_arch(self):
                    return "-march=native"
                def simd_width(self):
                    return "-D__AVX512__"
                def jit_load(self, verbose=False):
                    if self.name == "cpu_adam":
                        raise RuntimeError("c++: not found")
                    op = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / self.name
                    op.mkdir(parents=True)
                    (op / "pid").write_text(str(os.getpid()))

            class ShareMemCommBuilder(_Builder):
                name = "deepspeed_shm_comm"

            class CPUAdamBuilder(_Builder):
                name = "cpu_adam"

            class FusedAdamBuilder(_Builder):
                name = "fused_adam"
            """
        )
    )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "ninja").write_text("#!/bin/sh\necho 'ninja: no work to do.'\n")
    (bin_dir / "ninja").chmod(0o755)
    return {
        **os.environ,
        "PYTHONPATH": str(root),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }


def test_each_cpu_op_builds_in_its_own_process_and_a_failure_is_named(tmp_path):
    env = _stand_in_deepspeed(tmp_path, "cpu", {"cpu_adam": False})  # arm64's CPU-only wheel
    ext = tmp_path / "ext"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "jit", str(ext)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 1, out
    assert out.stderr.strip().splitlines()[-1] == (
        "prebuilding the CPU ops failed: CPUAdamBuilder (their errors above)"
    )
    assert "c++: not found" in out.stderr
    pids = {(ext / op / "pid").read_text() for op in ("deepspeed_shm_comm", "fused_adam")}
    assert len(pids) == 2 and str(os.getpid()) not in pids
    assert "prebuilt fused_adam (-march=x86-64-v3 -D__AVX256__)" in out.stdout


def test_cpu_adam_is_not_built_again_where_the_cuda_wheel_holds_it(tmp_path):
    env = _stand_in_deepspeed(tmp_path, "cuda", {"cpu_adam": True, "fused_adam": True})
    ext = tmp_path / "ext"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "jit", str(ext)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out
    assert "cpu_adam: the cuda wheel's, shared with the CPU accelerator" in out.stdout
    assert sorted(p.name for p in ext.iterdir()) == ["deepspeed_shm_comm", "fused_adam"]
