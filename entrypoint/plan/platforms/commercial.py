"""Container platforms that start one container per node and give WORLD_SIZE, RANK,
MASTER_ADDR, MASTER_PORT, where WORLD_SIZE counts nodes and RANK is the node's index
(for example `WORLD_SIZE=2`, `RANK=0|1`, `MASTER_ADDR=<job>-worker-0`).

WORLD_SIZE is ambiguous across platforms: torch means processes. The reading is decided here
from the whole environment, written into `notes`, and ENTRYPOINT_WORLD_SIZE_MEANS forces it.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms.base import (
    Reading,
    node_reading,
    read_addr,
    read_count,
    read_index,
    read_port,
    require,
)
from entrypoint.plan.values import (
    NODES,
    PER_NODE,
    PROCESSES,
    Sourced,
    below,
    by_default,
    derived,
    env_var,
)

NAME = "commercial"
DOCS = "https://pytorch.org/docs/stable/distributed.html#environment-variable-initialization"

WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
MEANS = "ENTRYPOINT_WORLD_SIZE_MEANS"


def detect(env: Mapping[str, str]) -> str | None:
    if env.get(WORLD_SIZE, "").strip() and env.get(RANK, "").strip():
        return f"{WORLD_SIZE} and {RANK} set"
    return None


def world_size_means(env: Mapping[str, str]) -> tuple[str, str]:
    """('nodes' | 'processes', why)."""
    forced = env.get(MEANS, "auto").strip().lower() or "auto"
    if forced not in ("auto", "nodes", "processes"):
        raise ConfigError(
            MEANS,
            forced,
            "not one of auto, nodes, processes",
            f"Set {MEANS}=nodes or {MEANS}=processes, or leave it unset",
        )
    if forced != "auto":
        return forced, f"forced by {MEANS}={forced}"
    if env.get(LOCAL_RANK, "").strip() and env.get(LOCAL_WORLD_SIZE, "").strip():
        return "processes", (
            f"{LOCAL_RANK} and {LOCAL_WORLD_SIZE} are set, so this process is "
            "one of several per node"
        )
    return "nodes", (
        f"{RANK} comes without {LOCAL_RANK}, as platforms that start one container "
        f"per node give it; set {MEANS}=processes if {WORLD_SIZE} counts processes"
    )


def placed(
    env: Mapping[str, str], rank: Sourced[int], per_node: Sourced[int]
) -> tuple[Sourced[int], Sourced[int]]:
    """(local_rank, node_rank) of a process the platform started, each checked against RANK:
    torchrun numbers ranks node by node, RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK."""
    local_rank = read_index(env, LOCAL_RANK, limit=PER_NODE) or Sourced(
        0, by_default(f"default 0 ({LOCAL_RANK} unset)", LOCAL_RANK)
    )
    below(LOCAL_RANK, local_rank.value, LOCAL_WORLD_SIZE, per_node.value)
    if rank.value % per_node.value != local_rank.value:
        raise ConfigError(
            LOCAL_RANK,
            local_rank.value,
            f"does not match {RANK}={rank.value} with {LOCAL_WORLD_SIZE}="
            f"{per_node.value} (expected {rank.value % per_node.value})",
            "Set RANK, LOCAL_RANK and LOCAL_WORLD_SIZE as torchrun does, or leave "
            "them to the platform",
        )
    node_rank = read_index(env, GROUP_RANK, limit=NODES) or Sourced(
        rank.value // per_node.value, derived(f"{RANK} // {LOCAL_WORLD_SIZE}", RANK)
    )
    if node_rank.value != rank.value // per_node.value:
        raise ConfigError(
            GROUP_RANK,
            node_rank.value,
            f"does not match {RANK}={rank.value} with {LOCAL_WORLD_SIZE}="
            f"{per_node.value} (expected {rank.value // per_node.value})",
            "Set RANK, GROUP_RANK and LOCAL_WORLD_SIZE as torchrun does, or leave "
            "them to the platform",
        )
    return local_rank, node_rank


def read(env: Mapping[str, str]) -> Reading:
    world = require(read_count(env, WORLD_SIZE, limit=PROCESSES), WORLD_SIZE, "the world size")
    rank = require(read_index(env, RANK, limit=PROCESSES), RANK, "the rank")
    below(RANK, rank.value, WORLD_SIZE, world.value)
    means, why = world_size_means(env)
    note = f"{WORLD_SIZE}={world.value} read as the number of {means}: {why}"
    addr = read_addr(env, MASTER_ADDR)
    port = read_port(env, MASTER_PORT)
    if means == "nodes":
        return node_reading(
            NAME,
            env,
            nnodes=Sourced(world.value, env_var(WORLD_SIZE, "(as nodes)")),
            node_rank=Sourced(rank.value, env_var(RANK, "(as node index)")),
            master_addr=addr,
            master_port=port,
            notes=(note,),
        )

    per_node = read_count(env, LOCAL_WORLD_SIZE, limit=PER_NODE) or Sourced(
        1, by_default(f"default 1 ({LOCAL_WORLD_SIZE} unset)", LOCAL_WORLD_SIZE)
    )
    if world.value % per_node.value:
        raise ConfigError(
            WORLD_SIZE,
            world.value,
            f"is not a multiple of {LOCAL_WORLD_SIZE}={per_node.value}",
            "Give every node the same number of processes",
        )
    local_rank, node_rank = placed(env, rank, per_node)
    return node_reading(
        NAME,
        env,
        nnodes=Sourced(
            world.value // per_node.value, derived(f"{WORLD_SIZE} / {LOCAL_WORLD_SIZE}", WORLD_SIZE)
        ),
        node_rank=node_rank,
        master_addr=addr,
        master_port=port,
        spawn=Sourced(False, derived(why)),
        rank=rank,
        local_rank=local_rank,
        nproc_per_node=per_node,
        notes=(note,),
    )


def job_identity(env: Mapping[str, str]) -> str:
    """None: its nodes carry no variable naming the job (ENTRYPOINT_JOB_ID does)."""
    return ""
