"""DeepSpeed through accelerate on CPU nodes: the same trainer that runs on GPUs.

accelerate 1.15 (`PartialState._prepare_backend`) picks a process-group backend only for an
accelerator it finds (CUDA, XPU, NPU, ...) or when told the job is CPU-only
(ACCELERATE_USE_CPU, `Accelerator(cpu=True)`), and CPU-only turns DeepSpeed off. A Hugging Face
Trainer with `--deepspeed`, or `Accelerator()` with a DeepSpeed plugin, on CPU workers then gets
no backend: DeepSpeed joins all the workers while accelerate counts a world of 1, and
DeepSpeed's batch check stops every rank (`train_batch_size 4 != 2 * 1 * 2`).

On a node the plan runs on CPU (it sets DS_ACCELERATOR=cpu) and only there, the site hook wraps
that method: where accelerate found nothing and several workers were started, the backend is
gloo and the job MULTI_CPU, which is what the same job gets on GPUs with nccl. Everything else
(ACCELERATE_USE_CPU, a backend passed in, any accelerator found) is accelerate's own choice.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

from entrypoint.trainer_side.after_import import when_imported

TARGET = "accelerate.state"
MARK = "DS_ACCELERATOR"  # the plan sets it to cpu on CPU nodes


def wanted(env: dict[str, str] | os._Environ) -> bool:
    return env.get(MARK) == "cpu"


def patch(state: ModuleType) -> None:
    cls = state.PartialState
    original = cls._prepare_backend
    if getattr(original, "_entrypoint_cpu", False):
        return

    def _prepare_backend(
        self: Any, cpu: bool = False, sagemaker_dp: bool = False, backend: str | None = None
    ) -> tuple[Any, Any]:
        chosen, kind = original(self, cpu, sagemaker_dp, backend)
        workers = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if (
            chosen is None
            and kind == state.DistributedType.NO
            and not cpu
            and os.environ.get("LOCAL_RANK") is not None
            and workers > 1
        ):
            return "gloo", state.DistributedType.MULTI_CPU
        return chosen, kind

    _prepare_backend._entrypoint_cpu = True  # type: ignore[attr-defined]
    cls._prepare_backend = _prepare_backend


def _patch_quietly(state: ModuleType) -> None:
    try:
        patch(state)
    except Exception as err:  # another accelerate: leave it as it is, and say so
        print(
            f"entrypoint: accelerate on CPU: not adapted ({type(err).__name__}: {err})",
            file=sys.stderr,
        )


def install() -> None:
    """Where the entrypoint marked a CPU node: accelerate's state takes gloo once it is
    imported. Raises nothing (the site hook never stops a trainer)."""
    if wanted(os.environ):
        when_imported(TARGET, _patch_quietly)
