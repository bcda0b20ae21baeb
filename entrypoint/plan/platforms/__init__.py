"""Platform detection: an explicit, documented order; the first module that recognises the
environment reads it. ENTRYPOINT_PLATFORM forces one.

Why this order: launchers nested inside others come first (mpirun inside a SLURM allocation
inherits SLURM_* of the batch step, so MPI's own variables must win); then schedulers with
unmistakable variables; then the generic torchrun-style names; then WORLD_SIZE/RANK, the most
ambiguous; then a single machine.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import (
    awsbatch,
    commercial,
    indexedjob,
    jobset,
    local,
    mpi,
    pytorchjob,
    sagemaker,
    skypilot,
    slurm,
    torchrun,
    trainjob,
    volcano,
)
from entrypoint.plan.platforms.base import Platform

# Typed: a module that lacks NAME, DOCS, detect or read fails the type check here.
PLATFORMS: tuple[Platform, ...] = (
    mpi,
    slurm,
    pytorchjob,
    trainjob,
    volcano,
    jobset,
    skypilot,
    awsbatch,
    sagemaker,
    indexedjob,
    torchrun,
    commercial,
    local,
)
ORDER: tuple[str, ...] = tuple(p.NAME for p in PLATFORMS)

FORCE = "ENTRYPOINT_PLATFORM"


def module(name: str) -> Platform:
    return PLATFORMS[ORDER.index(name)]


_VARIABLE = re.compile(r"^[A-Z][A-Z0-9_]+$")


@functools.cache
def variables() -> frozenset[str]:
    """Every variable a platform module names in its constants (`NNODES = ("NNODES", ...)`),
    but the entrypoint's own ENTRYPOINT_* settings."""
    names: set[str] = set()
    for platform in PLATFORMS:
        for attr, value in vars(platform).items():
            if not attr.isupper():
                continue
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, str) and _VARIABLE.match(item):
                    names.add(item)
    return frozenset(n for n in names if not n.startswith("ENTRYPOINT_"))


def refuse_empty(env: Mapping[str, str]) -> None:
    """A platform's variable set to '' is a mistake, not "unset": WORLD_SIZE='' would otherwise
    plan one machine, SLURM_NODEID='' node 0."""
    for name in sorted(variables()):
        raw = env.get(name)
        if raw is not None and not raw.strip():
            raise ConfigError(name, raw, "is set but empty", f"Give {name} a value, or unset it")


def detect(env: Mapping[str, str]) -> tuple[Platform, str]:
    """(platform, why it was chosen)."""
    refuse_empty(env)
    forced = env.get(FORCE, "").strip().lower()
    if forced and forced != "auto":
        if forced not in ORDER:
            raise ConfigError(
                FORCE, forced, "not a known platform", f"Use one of: auto, {', '.join(ORDER)}"
            )
        return module(forced), f"forced by {FORCE}={forced}"
    for candidate in PLATFORMS:
        reason = candidate.detect(env)
        if reason:
            return candidate, reason
    raise AssertionError("the local platform always matches")
