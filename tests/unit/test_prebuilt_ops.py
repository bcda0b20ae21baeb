"""DeepSpeed's prebuilt CPU ops, loadable everywhere (entrypoint/trainer_side/prebuilt_ops.py).

The image's side (the .pth file, DeepSpeed's real builder, torch's ninja run with no compiler) is
tests/image/test_deepspeed_ops.py; here the rule and the patch, on files and a stand-in module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from entrypoint.trainer_side import prebuilt_ops

# The cflags torch wrote for the image's fused_adam (docker/deepspeed_ops.py jit), abridged.
BUILD_NINJA = """ninja_required_version = 1.3
cxx = c++

cflags = -DTORCH_EXTENSION_NAME=fused_adam -DTORCH_API_INCLUDE_EXTENSION_H -I/x/includes \
-isystem /x/torch/include -fPIC -std=c++20 -O3 -g -Wno-reorder -march=x86-64-v3 -fopenmp \
-D__AVX256__ -UC10_USE_GLOG
post_cflags =
ldflags = -shared -L/x/torch/lib -lc10
"""


@pytest.mark.parametrize(
    "cflags, want",
    [
        (BUILD_NINJA, ("-march=x86-64-v3", "-D__AVX256__")),
        (
            "cflags = -O3 -march=armv8.2-a -fopenmp -D__SCALAR__\n",
            ("-march=armv8.2-a", "-D__SCALAR__"),
        ),
        ("cflags = -O3 -mcpu=native -D__AVX512__\n", ("-mcpu=native", "-D__AVX512__")),
        ("cflags = -O3 -DBF16_AVAILABLE -D__SVE__\n", (None, "-D__SVE__")),
        ("cxx = c++\nldflags = -shared\n", (None, None)),  # no cflags line
        ("", (None, None)),
    ],
)
def test_built_flags(cflags, want):
    assert prebuilt_ops.built_flags(cflags) == want


def _op(root, name, ninja=BUILD_NINJA, so=True):
    d = root / name
    d.mkdir(parents=True)
    (d / "build.ninja").write_text(ninja)
    if so:
        (d / f"{name}.so").write_bytes(b"\x7fELF")
    return d


def test_prebuilt_flags_only_for_an_op_built_there(tmp_path):
    _op(tmp_path, "fused_adam")
    _op(tmp_path, "cpu_lion", so=False)  # a build that never finished: not prebuilt
    want = ("-march=x86-64-v3", "-D__AVX256__")
    assert prebuilt_ops.prebuilt_flags("fused_adam", str(tmp_path)) == want
    assert prebuilt_ops.prebuilt_flags("cpu_lion", str(tmp_path)) == (None, None)
    assert prebuilt_ops.prebuilt_flags("cpu_adam", str(tmp_path)) == (None, None)
    assert prebuilt_ops.prebuilt_flags("fused_adam", None) == (None, None)
    assert prebuilt_ops.prebuilt_flags("fused_adam", str(tmp_path / "absent")) == (None, None)


def _stand_in_builder_module() -> types.ModuleType:
    """DeepSpeed's builder module's shape: OpBuilder asks the running CPU."""
    module = types.ModuleType("builder")

    class OpBuilder:
        def __init__(self, name):
            self.name = name

        def cpu_arch(self):
            return "-march=native"

        def simd_width(self):
            return "-D__AVX512__"

    class CPUOpBuilder(OpBuilder):  # as deepspeed/ops/op_builder/cpu/builder.py
        def cxx_args(self):
            return ["-O3", self.cpu_arch(), "-fopenmp", self.simd_width()]

    module.OpBuilder, module.CPUOpBuilder = OpBuilder, CPUOpBuilder
    return module


def test_the_builder_answers_a_prebuilt_ops_flags_and_its_own_for_others(tmp_path, monkeypatch):
    _op(tmp_path, "fused_adam")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    module = _stand_in_builder_module()
    prebuilt_ops.pin(module)
    prebuilt, other = module.CPUOpBuilder("fused_adam"), module.CPUOpBuilder("cpu_lion")
    assert prebuilt.cxx_args() == ["-O3", "-march=x86-64-v3", "-fopenmp", "-D__AVX256__"]
    assert other.cxx_args() == ["-O3", "-march=native", "-fopenmp", "-D__AVX512__"]
    # read when asked: a trainer given another TORCH_EXTENSIONS_DIR (the read-only root's links)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "elsewhere"))
    assert prebuilt.cxx_args() == ["-O3", "-march=native", "-fopenmp", "-D__AVX512__"]


def test_the_pth_line_patches_deepspeeds_builder_only_once_imported(tmp_path):
    """The .pth file's line, in a fresh interpreter: nothing imported at start; a module named
    as DeepSpeed's builder, imported later, comes out pinned."""
    repo = Path(__file__).resolve().parents[2]
    line = (repo / "docker" / "entrypoint-every-process.pth").read_text().splitlines()[-1]
    pkg = tmp_path / "deepspeed" / "ops" / "op_builder"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "deepspeed", tmp_path / "deepspeed" / "ops", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "builder.py").write_text(
        textwrap.dedent(
            """
            class OpBuilder:
                name = "fused_adam"
                def cpu_arch(self):
                    return "-march=native"
                def simd_width(self):
                    return "-D__AVX512__"
            """
        )
    )
    _op(tmp_path / "ext", "fused_adam")
    code = (
        f"{line}\n"
        "import sys\n"
        "assert 'deepspeed' not in sys.modules\n"
        "from deepspeed.ops.op_builder.builder import OpBuilder\n"
        "print(OpBuilder().cpu_arch(), OpBuilder().simd_width())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{repo}", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")},
    )
    assert out.stdout.split() == ["-march=x86-64-v3", "-D__AVX256__"], out.stderr


# -- the prebuilt CPU ops where torch can take their lock --------------------------------


def _prebuilt(root: Path) -> Path:
    """An extensions directory as docker/deepspeed_ops.py leaves it: two ops, each with its
    .so, object, ninja files and an old mtime ninja compares."""
    for op in ("cpu_adam", "fused_adam"):
        d = root / op
        d.mkdir(parents=True)
        for name in (f"{op}.so", f"{op}.o", "build.ninja", ".ninja_log", ".ninja_deps"):
            (d / name).write_text(f"{op} {name}")
            os.utime(d / name, (1_000_000, 1_000_000))
    (root / "cpu_adam" / "lock").write_text("")  # a lock a writable run left behind
    return root


def test_a_writable_extensions_dir_is_kept(tmp_path):
    source = _prebuilt(tmp_path / "ext")
    env = {"TORCH_EXTENSIONS_DIR": str(source), "PATH": "/bin"}
    assert prebuilt_ops.writable_extensions(env, tmp_path / "run") == (env, "", "")
    assert not (tmp_path / "run").exists()


def test_no_extensions_dir_nothing_to_do(tmp_path):
    assert prebuilt_ops.writable_extensions({}, tmp_path / "run", lambda _: False) == ({}, "", "")
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "absent")}
    assert prebuilt_ops.writable_extensions(env, tmp_path / "run", lambda _: False) == (env, "", "")


def test_a_read_only_extensions_dir_is_linked_into_the_run_dir(tmp_path):
    source = _prebuilt(tmp_path / "ext")
    env = {"TORCH_EXTENSIONS_DIR": str(source), "PATH": "/bin"}
    out, level, line = prebuilt_ops.writable_extensions(env, tmp_path / "run", lambda _: False)
    target = tmp_path / "run" / "torch_extensions"
    assert out == {"TORCH_EXTENSIONS_DIR": str(target), "PATH": "/bin"}
    assert (level, line) == (
        "info",
        f"TORCH_EXTENSIONS_DIR={source} is read-only: its 2 prebuilt ops are linked into "
        f"{target}, where torch can take their build lock",
    )
    for op in ("cpu_adam", "fused_adam"):
        d = target / op
        for built in (f"{op}.so", f"{op}.o"):  # linked: ninja stats through to the originals
            assert (d / built).is_symlink() and (d / built).resolve() == source / op / built
        for small in ("build.ninja", ".ninja_log", ".ninja_deps"):  # copied, times kept
            assert not (d / small).is_symlink()
            assert (d / small).read_text() == f"{op} {small}"
            assert (d / small).stat().st_mtime == 1_000_000
        assert not (d / "lock").exists()  # torch makes its own, here where it can
    # and DeepSpeed's record of the CPU ops reads the same from the new place
    assert sorted(p.parent.name for p in target.glob("*/*.so")) == ["cpu_adam", "fused_adam"]
    # a second node start in the same run dir finds it made and says the same
    assert prebuilt_ops.writable_extensions(env, tmp_path / "run", lambda _: False) == (
        out,
        level,
        line,
    )


def test_no_writable_run_dir_is_a_warning_not_a_failure(tmp_path):
    source = _prebuilt(tmp_path / "ext")
    (tmp_path / "file").write_text("")
    env = {"TORCH_EXTENSIONS_DIR": str(source)}
    out, level, line = prebuilt_ops.writable_extensions(env, tmp_path / "file", lambda _: False)
    assert out == env
    assert level == "warning"
    assert line.startswith(f"TORCH_EXTENSIONS_DIR={source} is read-only and its ops could not")
    assert line.endswith(f"make {tmp_path / 'file'} writable (a tmpfs on /tmp)")


def test_the_pth_line_is_silent_where_the_entrypoint_package_is_missing(tmp_path):
    """The image build runs Python before the package's layer is in: no traceback there."""
    repo = Path(__file__).resolve().parents[2]
    line = (repo / "docker" / "entrypoint-every-process.pth").read_text().splitlines()[-1]
    out = subprocess.run(
        [sys.executable, "-S", "-c", f"{line}\nprint('started')"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert (out.returncode, out.stdout, out.stderr) == (0, "started\n", "")


def _deepspeed_modules(monkeypatch, running: str, wheel: str, installed: dict) -> list:
    """Stand-ins for what share() reads: the running accelerator, the wheel's record, and the
    wheel's op module. Returns the torch versions validated."""
    validated: list = []
    accelerator = types.ModuleType("deepspeed.accelerator")
    accelerator.get_accelerator = lambda: types.SimpleNamespace(_name=running)
    record = types.ModuleType("deepspeed.git_version_info")
    record.accelerator_name, record.installed_ops = wheel, installed
    record.torch_info = {"version": "2.10"}
    for name, module in {
        "deepspeed": types.ModuleType("deepspeed"),
        "deepspeed.accelerator": accelerator,
        "deepspeed.git_version_info": record,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    return validated


def _loading_builder_module(validated: list) -> types.ModuleType:
    module = types.ModuleType("builder")

    class OpBuilder:
        _loaded_ops: dict = {}

        def __init__(self, name):
            self.name = name

        def absolute_name(self):
            return f"stand_in_ops.{self.name}_op"

        def validate_torch_version(self, info):
            validated.append(info["version"])

        def load(self, verbose=False):
            return f"jit:{self.name}"

    module.OpBuilder = OpBuilder
    return module


@pytest.mark.parametrize(
    ("running", "wheel", "installed", "name", "want"),
    [
        ("cpu", "cuda", {"cpu_adam": True}, "cpu_adam", "wheel"),  # the image on a CPU node
        ("cpu", "cuda", {"cpu_adam": True}, "fused_adam", "jit:fused_adam"),  # not shared
        ("cpu", "cuda", {"cpu_adam": False}, "cpu_adam", "jit:cpu_adam"),  # not in the wheel
        ("cuda", "cuda", {"cpu_adam": True}, "cpu_adam", "jit:cpu_adam"),  # DeepSpeed's own
        ("cpu", "cpu", {"cpu_adam": True}, "cpu_adam", "jit:cpu_adam"),  # DeepSpeed's own
    ],
)
def test_the_cpu_accelerator_loads_a_host_optimizer_from_the_cuda_wheel(
    tmp_path, monkeypatch, running, wheel, installed, name, want
):
    validated = _deepspeed_modules(monkeypatch, running, wheel, installed)
    (tmp_path / "stand_in_ops").mkdir()
    (tmp_path / "stand_in_ops" / "__init__.py").write_text("")
    (tmp_path / "stand_in_ops" / "cpu_adam_op.py").write_text("def destroy_adam(i): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = _loading_builder_module(validated)
    prebuilt_ops.share(module)
    got = module.OpBuilder(name).load()
    if want == "wheel":
        assert got.__file__ == str(tmp_path / "stand_in_ops" / "cpu_adam_op.py")
        assert module.OpBuilder._loaded_ops == {"cpu_adam": got} and validated == ["2.10"]
        # outside sys.modules, as torch keeps a JIT-built op: not emptied at exit before
        # the optimizer's __del__ calls it
        assert "stand_in_ops.cpu_adam_op" not in sys.modules
    else:
        assert got == want and validated == []


def test_a_shared_op_is_loaded_once_per_process(tmp_path, monkeypatch):
    """A second optimizer (DeepSpeed creates one per engine) gets DeepSpeed's cached op, not
    the extension executed again."""
    validated = _deepspeed_modules(monkeypatch, "cpu", "cuda", {"cpu_adam": True})
    (tmp_path / "stand_in_ops").mkdir()
    (tmp_path / "stand_in_ops" / "__init__.py").write_text("")
    (tmp_path / "stand_in_ops" / "cpu_adam_op.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = _loading_builder_module(validated)
    module.OpBuilder.load = lambda self, verbose=False: module.OpBuilder._loaded_ops[self.name]
    prebuilt_ops.share(module)
    first, second = module.OpBuilder("cpu_adam").load(), module.OpBuilder("cpu_adam").load()
    assert first is second and validated == ["2.10"]
