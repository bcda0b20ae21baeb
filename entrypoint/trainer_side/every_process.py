"""What the image does in every Python process, whether `entrypoint run` started it or not
(`docker run IMAGE python train.py`, `--entrypoint python`, torchrun typed by hand in the
container): a .pth file in the image's site-packages (docker/entrypoint-every-process.pth) calls
install() as the interpreter starts, before any sitecustomize. Nothing is imported until the
trainer imports what each part adapts."""

from __future__ import annotations

from entrypoint.trainer_side import exit_guard, prebuilt_ops


def install() -> None:
    """DeepSpeed's prebuilt ops taken as built (prebuilt_ops), and a gloo group left open settled
    at exit (exit_guard; registered here first, so it runs after every other exit handler, and
    the site hook's own install is then a no-op). Raises nothing."""
    prebuilt_ops.install()
    exit_guard.install()
