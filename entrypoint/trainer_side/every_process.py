"""What the image does in every Python process, whether `entrypoint run` started it or not
(`docker run IMAGE python train.py`, `--entrypoint python`, torchrun typed by hand in the
container): a .pth file in the image's site-packages (docker/entrypoint-every-process.pth) calls
install() as the interpreter starts, before any sitecustomize. It runs in every process, so it
imports only what registering needs; each part loads once the trainer imports what it adapts."""

from __future__ import annotations

from types import ModuleType

from entrypoint.trainer_side import exit_guard
from entrypoint.trainer_side.after_import import when_imported

DEEPSPEED_BUILDER = "deepspeed.ops.op_builder.builder"


def _prebuilt_ops(builder: ModuleType) -> None:
    from entrypoint.trainer_side import prebuilt_ops  # its imports take ~35 ms: only with DeepSpeed

    prebuilt_ops.in_this_process(builder)


def install() -> None:
    """Once DeepSpeed's op builder is imported, the image's prebuilt ops are taken as built
    (prebuilt_ops); a gloo group left open is settled at exit (exit_guard: registered here first,
    so it runs after every other exit handler, and the site hook's own install is then a no-op).
    Raises nothing."""
    try:
        when_imported(DEEPSPEED_BUILDER, _prebuilt_ops)
    except Exception:  # noqa: BLE001  never stop an interpreter from starting
        pass
    exit_guard.install()
