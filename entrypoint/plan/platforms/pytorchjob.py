"""Kubeflow training-operator v1 PyTorchJob: one pod per node, <job>-master-0 and <job>-worker-<i>.

What the operator puts in every container (pkg/controller.v1/pytorch/envvar.go, master.go):
- all versions, with a Master replica: MASTER_ADDR=<job>-master-0, MASTER_PORT (the container port
  named pytorchjob-port, default 23456), WORLD_SIZE, RANK (master 0, worker i -> i + 1),
  PYTHONUNBUFFERED.
- v1.7.0 on, also: PET_MASTER_ADDR, PET_MASTER_PORT, PET_NNODES (pods), PET_NODE_RANK (= RANK),
  PET_NPROC_PER_NODE (spec.nprocPerNode; the defaulter sets "auto"; v1.8 on only when set).
  WORLD_SIZE becomes pods x nprocPerNode when nprocPerNode is a number, pods when it is "auto"
  (getNprocPerNodeInt returns 1), while RANK stays the pod's index.
- before v1.7.0: WORLD_SIZE = pods and no PET_*; nothing tells it apart from a commercial platform,
  whose reading (WORLD_SIZE = nodes, RANK = node index) is the right one, so it is left to that.
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
    read_nproc,
    read_port,
    require,
)
from entrypoint.plan.values import NODES, PROCESSES, Sourced, below, env_var, first

NAME = "pytorchjob"
DOCS = (
    "https://github.com/kubeflow/training-operator/blob/v1.9.0/pkg/controller.v1/pytorch/envvar.go"
)

WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
MASTER_ADDR = ("MASTER_ADDR", "PET_MASTER_ADDR")
MASTER_PORT = ("MASTER_PORT", "PET_MASTER_PORT")
PET_NNODES = "PET_NNODES"
PET_NODE_RANK = "PET_NODE_RANK"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
# elasticPolicy without a Master replica (elastic.go): rendezvous endpoint, no rank at all.
PET_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"
PET_RDZV_BACKEND = "PET_RDZV_BACKEND"


def _set(env: Mapping[str, str], name: str) -> bool:
    return bool(env.get(name, "").strip())


def detect(env: Mapping[str, str]) -> str | None:
    if all(_set(env, n) for n in (WORLD_SIZE, RANK, PET_NNODES, PET_NODE_RANK)):
        return (
            f"{PET_NNODES}, {PET_NODE_RANK}, {WORLD_SIZE} and {RANK} set (training-operator v1.7+)"
        )
    if (
        _set(env, PET_RDZV_ENDPOINT)
        and _set(env, PET_RDZV_BACKEND)
        and _set(env, PET_NNODES)
        and not _set(env, PET_NODE_RANK)
        and not _set(env, RANK)
    ):
        return f"{PET_RDZV_ENDPOINT} and {PET_NNODES} set without a node rank (elastic PyTorchJob)"
    return None


def nproc_per_node(env: Mapping[str, str]) -> Sourced[int] | None:
    """A number, or None for torchrun's words (auto, gpu, cpu): then the plan decides."""
    return read_nproc(env, PET_NPROC_PER_NODE)[0]


def pods(env: Mapping[str, str]) -> Sourced[int]:
    raw = env.get(PET_NNODES, "").strip()
    if ":" in raw:
        raise ConfigError(
            PET_NNODES,
            raw,
            "is an elastic range (elasticPolicy min/maxReplicas)",
            "Give the PyTorchJob a fixed number of replicas; the entrypoint plans a "
            "fixed set of nodes",
        )
    return require(read_count(env, PET_NNODES, limit=NODES), PET_NNODES, "the number of pods")


def v17_nodes(
    env: Mapping[str, str],
    world: Sourced[int],
    rank: Sourced[int],
    per_node: Sourced[int] | None,
    notes: list[str],
) -> tuple[Sourced[int], Sourced[int]]:
    """(nnodes, node_rank) from training-operator v1.7+'s PET_NNODES and PET_NODE_RANK, with
    WORLD_SIZE read as pods or as processes, whichever it matches."""
    raw_nproc = env.get(PET_NPROC_PER_NODE, "").strip()
    nnodes = pods(env)
    node_rank = read_index(env, PET_NODE_RANK, limit=NODES) or Sourced(rank.value, env_var(RANK))
    if node_rank.value != rank.value:
        raise ConfigError(
            PET_NODE_RANK,
            node_rank.value,
            f"differs from {RANK}={rank.value}",
            "Do not set RANK or PET_NODE_RANK in the pod template; "
            "training-operator sets both to the pod's index",
        )
    as_processes = nnodes.value * per_node.value if per_node else None
    if per_node and world.value == as_processes:
        notes.append(
            f"{WORLD_SIZE}={world.value} read as processes because "
            f"{PET_NPROC_PER_NODE}={per_node.value} and {PET_NNODES}={nnodes.value} "
            "(training-operator v1.7+ multiplies by nprocPerNode); nodes and node "
            f"rank come from {PET_NNODES} and {PET_NODE_RANK}"
        )
    elif world.value == nnodes.value:
        why = (
            f"{PET_NPROC_PER_NODE}={raw_nproc} is not a number"
            if raw_nproc
            else f"{PET_NPROC_PER_NODE} is unset"
        )
        notes.append(
            f"{WORLD_SIZE}={world.value} read as pods because {why}, so "
            "training-operator counts one process per pod"
        )
    else:
        expected = f"{PET_NNODES}={nnodes.value}"
        if as_processes:
            expected += f" or {PET_NNODES} x {PET_NPROC_PER_NODE}={as_processes}"
        raise ConfigError(
            WORLD_SIZE,
            world.value,
            f"matches neither {expected}",
            "Do not set WORLD_SIZE in the pod template; training-operator sets it",
        )
    return nnodes, node_rank


def read(env: Mapping[str, str]) -> Reading:
    if not _set(env, RANK) and not _set(env, PET_NODE_RANK):
        raise ConfigError(
            PET_NODE_RANK,
            None,
            f"an elastic PyTorchJob gives no node rank, only {PET_RDZV_ENDPOINT}",
            "Use a Master replica and Workers without elasticPolicy, so every pod "
            "gets RANK and PET_NODE_RANK",
        )
    world = require(read_count(env, WORLD_SIZE, limit=PROCESSES), WORLD_SIZE, "the world size")
    rank = require(read_index(env, RANK, limit=NODES), RANK, "the rank")
    per_node = nproc_per_node(env)
    notes: list[str] = []

    if _set(env, PET_NNODES):
        nnodes, node_rank = v17_nodes(env, world, rank, per_node, notes)
    else:
        # Before v1.7 there is no PET_NNODES and WORLD_SIZE counts pods.
        below(RANK, rank.value, WORLD_SIZE, world.value)
        nnodes = Sourced(world.value, env_var(WORLD_SIZE, "(as pods)"))
        node_rank = Sourced(rank.value, env_var(RANK, "(as pod index)"))
        notes.append(
            f"{WORLD_SIZE}={world.value} read as pods: no {PET_NNODES}, as "
            "training-operator before v1.7 sets it"
        )

    found = first(env, *MASTER_ADDR)
    if found:
        notes.append(f"master is the Master replica's pod ({found[0]}={found[1]})")
    return node_reading(
        NAME,
        env,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=read_addr(env, *MASTER_ADDR),
        master_port=read_port(env, *MASTER_PORT),
        nproc_per_node=per_node,
        notes=tuple(notes),
    )


def job_identity(env: Mapping[str, str]) -> str:
    """None: its nodes carry no variable naming the job (ENTRYPOINT_JOB_ID does)."""
    return ""
