"""The platform contract: `Platform`, the face every platform module has, and `Reading`, what
its `read` returns (the platform's own statement of where this node stands).

Nothing here touches os.environ or the machine; the caller passes a plain mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.ports import DEFAULT_MASTER_PORT
from entrypoint.plan.values import (
    NODES,
    PER_NODE,
    Limit,
    Sourced,
    below,
    by_default,
    count,
    env_var,
    first,
    host,
    index,
    port,
)


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
    spawn: Sourced[bool] = Sourced(
        True, by_default("default: one process per node, the entrypoint spawns workers")
    )
    rank: Sourced[int] | None = None
    local_rank: Sourced[int] | None = None
    nproc_per_node: Sourced[int] | None = None
    gpus_per_node: Sourced[int] | None = None
    hosts: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())


class Platform(Protocol):
    """A platform module (entrypoint/plan/platforms/<name>.py); a type checker holds each to it
    through the typed ORDER in entrypoint/plan/platforms/__init__.py."""

    NAME: str  # the name users pass to ENTRYPOINT_PLATFORM
    DOCS: str  # where the platform documents its variables

    def detect(self, env: Mapping[str, str], /) -> str | None:
        """Why this platform is recognised in env, or None."""
        ...

    def read(self, env: Mapping[str, str], /) -> Reading:
        """Pure: environment in, Reading out, or the one-line ConfigError for what it lacks."""
        ...

    def job_identity(self, env: Mapping[str, str], /) -> str:
        """`VARIABLE=value` naming this node's job (the same on every node of one job, another
        for the next job), or "" when the platform gives its nodes no such variable."""
        ...


def named_by(env: Mapping[str, str], *names: str) -> str:
    """`NAME=value` for the first of `names` set and not blank in env, or ""."""
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return f"{name}={value}"
    return ""


# Every number, host and port a platform reads goes through entrypoint.plan.values: ASCII digits,
# bounded by the Limit of what it counts; one host per address: a name, IPv4 or IPv6.


def read_index(env: Mapping[str, str], *names: str, limit: Limit) -> Sourced[int] | None:
    """A 0-based index below limit.high (then `below` checks it inside the job)."""
    found = first(env, *names)
    return None if found is None else Sourced(index(found[0], found[1], limit), env_var(found[0]))


def read_count(
    env: Mapping[str, str], *names: str, limit: Limit, allow_zero: bool = False
) -> Sourced[int] | None:
    found = first(env, *names)
    if found is None:
        return None
    return Sourced(count(found[0], found[1], limit, allow_zero=allow_zero), env_var(found[0]))


def read_addr(env: Mapping[str, str], *names: str) -> Sourced[str] | None:
    """Node 0's address: one host name, IPv4 or IPv6 address (brackets dropped)."""
    found = first(env, *names)
    return None if found is None else Sourced(host(found[0], found[1]), env_var(found[0]))


def read_port(env: Mapping[str, str], *names: str) -> Sourced[int]:
    found = first(env, *names)
    if found is None:
        return Sourced(
            DEFAULT_MASTER_PORT, by_default(f"default {DEFAULT_MASTER_PORT} (torchrun's)")
        )
    return Sourced(port(found[0], found[1]), env_var(found[0]))


def read_hosts(name: str, raw: str, hosts: list[str]) -> tuple[str, ...]:
    """Every node's host as a platform lists them (master first): each one host name or IP
    address (a link-local one without its zone only after the first, node 0), at most
    NODES.high, none twice."""
    if len(hosts) > NODES.high:
        raise ConfigError(
            name,
            f"{raw[:60]}...",
            f"lists {len(hosts)} hosts, above the limit of {NODES.high} nodes",
            "Run at most that many nodes in one job",
        )
    if not hosts:
        raise ConfigError(name, raw, "lists no host", f"Let the platform set {name}")
    checked = [host(name, hosts[0])] + [host(name, h, master=False) for h in hosts[1:]]
    seen: set[str] = set()
    for one in checked:
        if one in seen:
            raise ConfigError(name, raw, f"names {one} twice", "List every node once")
        seen.add(one)
    return tuple(checked)


# torchrun's --nproc-per-node also takes these words; the plan then decides from the devices.
NPROC_WORDS = ("auto", "gpu", "cpu", "xpu")


def read_nproc(env: Mapping[str, str], *names: str) -> tuple[Sourced[int] | None, str | None]:
    """(workers per node, or None for torchrun's words; a note when a word was given)."""
    found = first(env, *names)
    if found is None:
        return None, None
    if found[1].lower() in NPROC_WORDS:
        return None, f"{found[0]}={found[1]}: workers per node decided from this node's devices"
    if not (found[1].isascii() and found[1].isdigit()):
        raise ConfigError(
            found[0],
            found[1],
            f"neither a number nor one of torchrun's words ({', '.join(NPROC_WORDS)})",
            f"Set {found[0]} to a number of workers per node, or auto",
        )
    return Sourced(count(found[0], found[1], PER_NODE), env_var(found[0])), None


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
    **more: Any,
) -> Reading:
    """Check the node counts hang together, then build the Reading."""
    if nnodes.value > NODES.high:
        raise ConfigError(
            nnodes.source.names("nnodes"),
            nnodes.value,
            f"makes {nnodes.value} nodes ({nnodes.source}), above the limit of {NODES.high}",
            "Run at most that many nodes in one job",
        )
    below(
        node_rank.source.names("node_rank"),
        node_rank.value,
        nnodes.source.names("nnodes"),
        nnodes.value,
    )
    per_node = more.get("nproc_per_node")
    if per_node is not None and per_node.value > PER_NODE.high:
        raise ConfigError(
            per_node.source.names("nproc_per_node"),
            per_node.value,
            f"makes {per_node.value} processes per node ({per_node.source}), above "
            f"the limit of {PER_NODE.high}",
            "Start at most that many per node",
        )
    return Reading(
        platform=platform,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        **more,
    )
