"""The platform contract: `Platform`, the face every platform module has, and `Reading`, what
its `read` returns (the platform's own statement of where this node stands).

Nothing here touches os.environ or the machine; the caller passes a plain mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from entrypoint.errors import ConfigError
from entrypoint.values import Sourced, below, first, index, port, positive_int, variable_of

DEFAULT_MASTER_PORT = 29500  # torchrun's default


@dataclass(frozen=True)
class Reading:
    """Where this node stands, as the platform states it. Counts are nodes, not processes,
    unless the platform started one process per GPU itself (spawn is then False)."""

    platform: str
    nnodes: Sourced[int]
    node_rank: Sourced[int]
    master_addr: Sourced[str] | None
    master_port: Sourced[int]
    # False when the platform already started one process per GPU (srun --ntasks-per-node=8,
    # mpirun -npernode 8): then rank/local_rank place this process and nothing is spawned.
    spawn: Sourced[bool] = Sourced(True, "default: one process per node, the entrypoint spawns workers")
    rank: Sourced[int] | None = None
    local_rank: Sourced[int] | None = None
    nproc_per_node: Sourced[int] | None = None
    gpus_per_node: Sourced[int] | None = None
    hosts: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())


class Platform(Protocol):
    """A platform module (entrypoint/platforms/<name>.py); a type checker holds each to it
    through the typed ORDER in entrypoint/platforms/__init__.py."""

    NAME: str  # the name users pass to ENTRYPOINT_PLATFORM
    DOCS: str  # where the platform documents its variables

    def detect(self, env: Mapping[str, str], /) -> str | None:
        """Why this platform is recognised in env, or None."""
        ...

    def read(self, env: Mapping[str, str], /) -> Reading:
        """Pure: environment in, Reading out, or the one-line ConfigError for what it lacks."""
        ...


def read_index(env: Mapping[str, str], *names: str) -> Sourced[int] | None:
    found = first(env, *names)
    return None if found is None else Sourced(index(found[0], found[1]), f"env {found[0]}")


def read_count(env: Mapping[str, str], *names: str) -> Sourced[int] | None:
    found = first(env, *names)
    return None if found is None else Sourced(positive_int(found[0], found[1]), f"env {found[0]}")


def read_addr(env: Mapping[str, str], *names: str) -> Sourced[str] | None:
    found = first(env, *names)
    return None if found is None else Sourced(found[1], f"env {found[0]}")


def read_port(env: Mapping[str, str], *names: str) -> Sourced[int]:
    found = first(env, *names)
    if found is None:
        return Sourced(DEFAULT_MASTER_PORT, f"default {DEFAULT_MASTER_PORT} (torchrun's)")
    return Sourced(port(found[0], found[1]), f"env {found[0]}")


def require(value: Sourced[int] | None, names: str, what: str) -> Sourced[int]:
    if value is None:
        raise ConfigError(names, None, f"{what} is not set", f"Set {names}")
    return value


def node_reading(
    platform: str,
    env: Mapping[str, str],
    *,
    nnodes: Sourced[int],
    node_rank: Sourced[int],
    master_addr: Sourced[str] | None,
    master_port: Sourced[int],
    **more,
) -> Reading:
    """Check the node counts hang together, then build the Reading."""
    below(variable_of(node_rank.source), node_rank.value, variable_of(nnodes.source), nnodes.value)
    return Reading(
        platform=platform,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        **more,
    )
