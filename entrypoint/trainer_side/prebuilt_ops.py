"""DeepSpeed's prebuilt CPU ops, loadable in every Python process of the image, on any CPU and on
a read-only root. A .pth file in the image's site-packages has in_this_process() called once
DeepSpeed's op builder is imported (trainer_side/every_process.py); this module is not even
imported before.

The image prebuilds the CPU accelerator's ops into TORCH_EXTENSIONS_DIR for a pinned CPU level
(docker/deepspeed_ops.py: -march=x86-64-v3 and AVX2 on x86-64) and has no compiler. At load,
torch takes a lock in the op's directory (torch 2.14: an flock on `lock`, opened read-write),
writes the op's build.ninja again from the flags DeepSpeed asks the running CPU for
(-march=native, its widest SIMD) and runs ninja. Two things would turn that into a build that
cannot work:

- flags: a command line unlike the build's is a rebuild ("c++: not found"). For an op prebuilt
  there, DeepSpeed's builder answers the flags the op was built with, read from its build.ninja,
  so ninja has nothing to do (pin). Any other op gets DeepSpeed's own answer. The prebuilt ops
  run on any CPU of that level or newer, as they did when torch (up to 2.13) loaded them without
  running ninja.
- the lock: a read-only directory cannot be locked. Its ops are linked into a writable one
  (the objects and the op itself by symbolic link, ninja's small files copied with their times)
  and TORCH_EXTENSIONS_DIR points there (writable_extensions). `entrypoint run` does it once per
  node before the trainer starts, in its run directory, and logs it; a process started without
  it does it here, under the temporary directory, with one line on stderr.

One op is not prebuilt there but shared: DeepSpeed's CUDA accelerator builds its host-side
optimizers (cpu_adam) with the CPU accelerator's own builder, so the op the CUDA wheel holds is
the one the CPU accelerator would build, from the same sources with the same pinned flags. The
image builds it once; on the CPU accelerator, DeepSpeed's builder loads the wheel's (share),
where DeepSpeed itself would take an op installed for another accelerator as missing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

_ARCH = re.compile(r"^-m(arch|cpu)=\S+$")
_SIMD = re.compile(r"^-D__(AVX\d+|SCALAR|SVE\w*|NEON\w*)__$")
# The small files ninja reads (and may rewrite) are copied; the objects and the op are linked.
# Copies keep their times: ninja compares them with the objects'.
_NINJA_FILES = ("build.ninja", ".ninja_log", ".ninja_deps")
# The ops DeepSpeed's CUDA accelerator builds with the CPU accelerator's builder
# (deepspeed/accelerator/cuda_accelerator.py: host-side optimizers run on the CPU wherever the
# model lives); docker/deepspeed_ops.py leaves those the wheel holds out of the prebuilt ones.
SHARED_CPU_OPS = frozenset({"cpu_adam", "cpu_adagrad", "cpu_lion"})


def built_flags(build_ninja: str) -> tuple[str | None, str | None]:
    """(the -march/-mcpu flag, the SIMD define) in a torch build.ninja's cflags; None: absent."""
    for line in build_ninja.splitlines():
        if line.startswith("cflags = "):
            words = line.split()[2:]
            arch = next((w for w in words if _ARCH.match(w)), None)
            simd = next((w for w in words if _SIMD.match(w)), None)
            return arch, simd
    return None, None


def prebuilt_flags(name: str, extensions_dir: str | None) -> tuple[str | None, str | None]:
    """The flags op `name` was prebuilt with in extensions_dir; (None, None): not prebuilt."""
    if not extensions_dir or not name:
        return None, None
    op = Path(extensions_dir) / name
    try:
        if not (op / f"{name}.so").exists():
            return None, None
        return built_flags((op / "build.ninja").read_text())
    except (OSError, UnicodeDecodeError):
        return None, None


def pin(module: ModuleType) -> None:
    """DeepSpeed's OpBuilder answers a prebuilt op's own flags (the others: its own answer)."""
    builder = module.OpBuilder
    own_arch, own_simd = builder.cpu_arch, builder.simd_width

    def cpu_arch(self: Any) -> str:
        arch, _ = prebuilt_flags(self.name, os.environ.get("TORCH_EXTENSIONS_DIR"))
        return arch or own_arch(self)

    def simd_width(self: Any) -> str:
        _, simd = prebuilt_flags(self.name, os.environ.get("TORCH_EXTENSIONS_DIR"))
        return simd or own_simd(self)

    builder.cpu_arch, builder.simd_width = cpu_arch, simd_width


def share(module: ModuleType) -> None:
    """DeepSpeed's OpBuilder.load, on the CPU accelerator, loads a SHARED_CPU_OPS op that the
    wheel holds for the CUDA accelerator, instead of building it just in time."""
    builder = module.OpBuilder
    own_load = getattr(builder, "load", None)
    if own_load is None:
        return

    def load(self: Any, verbose: bool = False) -> object:
        loaded = getattr(builder, "_loaded_ops", {})
        if self.name in SHARED_CPU_OPS and self.name not in loaded:  # loaded: DeepSpeed's cache
            op = wheels_op(self)
            if op is not None:
                loaded[self.name] = op
                return op
        return own_load(self, verbose)

    builder.load = load


def wheels_op(op: object) -> ModuleType | None:
    """The op as the wheel built it for another accelerator, while the CPU accelerator runs;
    None: DeepSpeed's own load decides (another accelerator runs, or the wheel lacks it)."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import accelerator_name, installed_ops, torch_info

    name = getattr(op, "name", "")
    if get_accelerator()._name != "cpu" or accelerator_name == "cpu":
        return None
    if not installed_ops.get(name):
        return None
    op.validate_torch_version(torch_info)  # type: ignore[attr-defined]
    try:
        spec = importlib.util.find_spec(op.absolute_name())  # type: ignore[attr-defined]
        if spec is None or spec.loader is None:
            return None
        # Loaded as torch loads a JIT-built op, outside sys.modules: a module there is emptied
        # at interpreter exit before the optimizer's __del__ calls it (DeepSpeed's own import
        # of the op prints a TypeError then).
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except ImportError:
        return None


def writable_extensions(
    env: Mapping[str, str],
    run_dir: Path,
    can_write: Callable[[Path], bool] = lambda path: os.access(path, os.W_OK),
) -> tuple[dict[str, str], Literal["", "info", "warning"], str]:
    """The environment with TORCH_EXTENSIONS_DIR where torch can take each op's lock, and the
    log level and line that say what was done ("" when nothing was). A writable directory is
    kept; a read-only one's ops are linked into run_dir/torch_extensions."""
    out = dict(env)
    source = env.get("TORCH_EXTENSIONS_DIR")
    if not source:
        return out, "", ""
    try:
        ops = sorted(d for d in Path(source).iterdir() if d.is_dir())
    except OSError:
        return out, "", ""
    if all(can_write(op) for op in ops):
        return out, "", ""
    target = run_dir / "torch_extensions"
    try:
        for op in ops:
            _link_op(op, target / op.name)
    except OSError as err:
        return (
            out,
            "warning",
            (
                f"TORCH_EXTENSIONS_DIR={source} is read-only and its ops could not be linked into "
                f"{target} ({err.strerror}): DeepSpeed on the CPU cannot load them; "
                f"make {run_dir} writable (a tmpfs on /tmp)"
            ),
        )
    out["TORCH_EXTENSIONS_DIR"] = str(target)
    return (
        out,
        "info",
        (
            f"TORCH_EXTENSIONS_DIR={source} is read-only: its {len(ops)} prebuilt ops are linked "
            f"into {target}, where torch can take their build lock"
        ),
    )


def _link_op(op: Path, dest: Path) -> None:
    """The op's links made aside, then renamed into place whole: ranks that start together
    never see an op half made (the first to rename wins; the others drop theirs)."""
    if dest.is_dir():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(prefix=f".{op.name}-", dir=dest.parent))
    try:
        for item in op.iterdir():
            if item.name == "lock":
                continue  # torch makes its own, where it can
            if item.name in _NINJA_FILES:
                shutil.copy2(item, aside / item.name)
            else:
                (aside / item.name).symlink_to(item)
        aside.chmod(0o775)
        try:
            aside.rename(dest)
        except OSError:
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def in_this_process(module: ModuleType) -> None:
    """Once DeepSpeed's builder is imported: its flags pinned, the shared ops loaded from the
    wheel, the ops' directory writable."""
    try:
        pin(module)
        share(module)
        base = Path(tempfile.gettempdir()) / f"entrypoint-{os.getuid()}"
        env, level, line = writable_extensions(os.environ, base)
        if level == "info":
            os.environ["TORCH_EXTENSIONS_DIR"] = env["TORCH_EXTENSIONS_DIR"]
        if level:
            print(f"entrypoint: {line}", file=sys.stderr, flush=True)
    except Exception as err:  # noqa: BLE001  never break the trainer's import of DeepSpeed
        print(f"entrypoint: prebuilt ops: {type(err).__name__}: {err}", file=sys.stderr)
