"""Platform detection: an explicit, documented order; the first module that recognises the
environment reads it. ENTRYPOINT_PLATFORM forces one.

Why this order: launchers nested inside others come first (mpirun inside a SLURM allocation
inherits SLURM_* of the batch step, so MPI's own variables must win); then schedulers with
unmistakable variables; then the generic torchrun-style names; then WORLD_SIZE/RANK, the most
ambiguous; then a single machine.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType

from entrypoint.errors import ConfigError

ORDER: tuple[str, ...] = (
    "mpi",
    "slurm",
    "pytorchjob",
    "trainjob",
    "volcano",
    "jobset",
    "skypilot",
    "awsbatch",
    "sagemaker",
    "indexedjob",
    "torchrun",
    "commercial",
    "local",
)

FORCE = "ENTRYPOINT_PLATFORM"


def module(name: str) -> ModuleType:
    return importlib.import_module(f"entrypoint.platforms.{name}")


def detect(env: Mapping[str, str]) -> tuple[ModuleType, str]:
    """(platform module, why it was chosen)."""
    forced = env.get(FORCE, "").strip().lower()
    if forced and forced != "auto":
        if forced not in ORDER:
            raise ConfigError(FORCE, forced, "not a known platform",
                              f"Use one of: auto, {', '.join(ORDER)}")
        return module(forced), f"forced by {FORCE}={forced}"
    for name in ORDER:
        candidate = module(name)
        reason = candidate.detect(env)
        if reason:
            return candidate, reason
    raise AssertionError("the local platform always matches")
