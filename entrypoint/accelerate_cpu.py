"""accelerate and the Hugging Face Trainer with DeepSpeed on CPU nodes.

accelerate 1.15's `PartialState` picks its process-group backend from the GPUs it finds; under
DeepSpeed (`ACCELERATE_USE_DEEPSPEED=true`, set by `accelerate launch` with a DeepSpeed config
and by transformers' `TrainingArguments(deepspeed=...)`) on a node without one it finds none,
leaves the backend unset and counts a world of 1 process, although DeepSpeed has joined every
rank over gloo. The Trainer then sizes DeepSpeed's batch for 1 process ("train_batch_size is not
equal to micro_batch_per_gpu * gradient_acc_step * world_size"), and accelerate's data loaders
are not sharded and its `gather` fails ("ProcessGroupGloo::allgather: invalid output tensor
list"). Passing `InitProcessGroupKwargs(backend="gloo")` fixes it in the trainer; this module
does the same from outside it, only where the plan put DeepSpeed on the CPU
(DS_ACCELERATOR=cpu), by answering "gloo" where accelerate found no backend.

Installed like jax_cluster, by the site hook the plan puts first on the trainer's PYTHONPATH:
`install()` waits for the first import of `accelerate.state` and imports nothing itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Mapping

TARGET = "accelerate.state"


def backend_for(found: str | None, env: Mapping[str, str]) -> str | None:
    """The backend accelerate should use: its own choice, else gloo for DeepSpeed workers on
    the CPU (a rank started by a launcher, DeepSpeed's CPU accelerator, accelerate's DeepSpeed
    path)."""
    if found is not None:
        return found
    if (env.get("DS_ACCELERATOR") == "cpu" and env.get("LOCAL_RANK") is not None
            and env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"):
        return "gloo"
    return None


def patch(state) -> None:
    """Wrap `PartialState._prepare_backend` of the module `accelerate.state`, once."""
    cls = state.PartialState
    original = cls._prepare_backend
    if getattr(original, "_entrypoint", False):
        return

    def _prepare_backend(self, *args, **kwargs):
        backend, distributed_type = original(self, *args, **kwargs)
        return backend_for(backend, os.environ), distributed_type

    _prepare_backend._entrypoint = True  # type: ignore[attr-defined]
    cls._prepare_backend = _prepare_backend


class _AfterImport(importlib.abc.MetaPathFinder):
    """Find `accelerate.state` as usual, then patch it once its module has run."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            _patch_quietly(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch_quietly(state) -> None:
    try:
        patch(state)
    except Exception as err:  # another accelerate: the trainer passes the backend itself
        print(f"entrypoint: accelerate on CPU: could not set its backend ({type(err).__name__}: "
              f"{err}); pass InitProcessGroupKwargs(backend='gloo') to Accelerator",
              file=sys.stderr)


def install(env: Mapping[str, str] = os.environ) -> None:
    """Patch now if accelerate's state is loaded, else when it is first imported; only where
    DeepSpeed runs on the CPU."""
    if env.get("DS_ACCELERATOR") != "cpu":
        return
    if TARGET in sys.modules:
        _patch_quietly(sys.modules[TARGET])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
