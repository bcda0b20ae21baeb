"""SLURM: sbatch + srun, with one task per node (we spawn) or one task per GPU (SLURM spawned).

Variables: https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES
and https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.hostlist import expand_var
from entrypoint.plan.platforms.base import (
    Reading,
    named_by,
    node_reading,
    read_count,
    read_index,
    read_port,
)
from entrypoint.plan.values import (
    GPUS,
    NODES,
    PER_NODE,
    PROCESSES,
    Sourced,
    by_default,
    derived,
    env_var,
    first,
    host,
)

NAME = "slurm"
DOCS = "https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES"

JOB_ID = ("SLURM_JOB_ID", "SLURM_JOBID")
# The step's list first: srun -N2 inside a larger allocation numbers SLURM_NODEID within the step.
NODELIST = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
NNODES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
NODEID = ("SLURM_NODEID",)
PROCID = ("SLURM_PROCID",)
LOCALID = ("SLURM_LOCALID",)
NTASKS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
GPUS_ON_NODE = ("SLURM_GPUS_ON_NODE",)
STEP_ID = "SLURM_STEP_ID"
MASTER_PORT = ("MASTER_PORT",)

_TASKS_ITEM = re.compile(r"^([0-9]{1,9})(?:\(x([0-9]{1,9})\))?$")


def detect(env: Mapping[str, str]) -> str | None:
    job = first(env, *JOB_ID)
    nodes = first(env, *NODELIST)
    if job and nodes:
        return f"{job[0]} and {nodes[0]} set"
    return None


def tasks_per_node(name: str, raw: str) -> list[tuple[int, int]]:
    """SLURM's compressed form, not expanded: `8(x2),4` -> [(8, 2), (4, 1)]. Each count is
    1..PER_NODE.high tasks, each repeat at least 1, the nodes they cover at most NODES.high."""
    fix = "Expect a value like 8(x2) or 2,2, as srun sets it; launch the step with srun"
    counts: list[tuple[int, int]] = []
    for item in raw.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if not match:
            raise ConfigError(name, raw, "not SLURM's tasks-per-node form", fix)
        tasks, repeat = int(match[1]), int(match[2] or 1)
        if not 1 <= tasks <= PER_NODE.high:
            raise ConfigError(
                name, raw, f"gives {tasks} tasks per node, outside 1 to {PER_NODE.high}", fix
            )
        if repeat < 1:
            raise ConfigError(name, raw, f"repeats {tasks} tasks on {repeat} nodes", fix)
        counts.append((tasks, repeat))
    if sum(repeat for _, repeat in counts) > NODES.high:
        raise ConfigError(name, raw, f"covers more than {NODES.high} nodes", fix)
    return counts


def master_port(env: Mapping[str, str]) -> Sourced[int]:
    """MASTER_PORT if set; else one derived from the job id, so two jobs sharing a node differ."""
    job = first(env, *JOB_ID)
    numeric = job is not None and job[1].isascii() and job[1].isdigit() and len(job[1]) <= 18
    if first(env, *MASTER_PORT) or job is None or not numeric:
        return read_port(env, *MASTER_PORT)
    return Sourced(
        15000 + int(job[1]) % 20000, derived(f"derived from {job[0]} (15000 + id mod 20000)")
    )


def tasks_on_each_node(env: Mapping[str, str], nnodes: Sourced[int]) -> Sourced[int] | None:
    """The step's tasks per node, the same on every node, if SLURM says."""
    found = first(env, *TASKS_PER_NODE)
    if found:
        counts = tasks_per_node(*found)
        if len({tasks for tasks, _ in counts}) > 1:
            raise ConfigError(
                found[0],
                found[1],
                "tasks differ between nodes",
                "Use --ntasks-per-node=1 (or one task per GPU on every node)",
            )
        return Sourced(counts[0][0], env_var(found[0]))
    ntasks = read_count(env, *NTASKS, limit=PROCESSES)
    if ntasks and ntasks.value % nnodes.value == 0:
        return Sourced(ntasks.value // nnodes.value, derived(f"{ntasks.source} / {nnodes.source}"))
    return None


def task_place(
    env: Mapping[str, str], nnodes: Sourced[int], per_node: Sourced[int] | None
) -> tuple[Sourced[int] | None, Sourced[int] | None]:
    """(SLURM_PROCID, SLURM_LOCALID) as read: the task's own place, checked inside the step
    wherever it is known."""
    rank = read_index(env, *PROCID, limit=PROCESSES)
    local_rank = read_index(env, *LOCALID, limit=PER_NODE)
    if per_node and rank and rank.value >= nnodes.value * per_node.value:
        raise ConfigError(
            PROCID[0],
            rank.value,
            f"must be below the step's {nnodes.value * per_node.value} tasks "
            f"({nnodes.value} nodes x {per_node.value} tasks per node, "
            f"{per_node.source}; task ranks count from 0)",
            "Start the entrypoint with srun, which numbers the tasks of its step",
        )
    if per_node and local_rank and local_rank.value >= per_node.value:
        raise ConfigError(
            LOCALID[0],
            local_rank.value,
            f"must be below the {per_node.value} tasks per node ({per_node.source})",
            "Start the entrypoint with srun, which numbers the tasks on each node",
        )
    return rank, local_rank


def spawn_or_place(
    env: Mapping[str, str],
    per_node: Sourced[int] | None,
    rank: Sourced[int] | None,
    local_rank: Sourced[int] | None,
) -> dict:
    """One task per node spawns the workers; several are the workers, placed by srun."""
    if per_node and per_node.value > 1:
        # srun started one task per GPU itself: place this process, spawn nothing.
        if rank is None or local_rank is None:
            raise ConfigError(
                "SLURM_PROCID",
                env.get("SLURM_PROCID"),
                "several tasks per node but no task rank",
                "Start the entrypoint with srun, which sets SLURM_PROCID and SLURM_LOCALID",
            )
        return {
            "spawn": Sourced(
                False, derived(f"{per_node.value} tasks per node ({per_node.source})")
            ),
            "rank": rank,
            "local_rank": local_rank,
            "nproc_per_node": per_node,
        }
    return {"spawn": Sourced(True, derived("one task per node: the entrypoint spawns the workers"))}


def read(env: Mapping[str, str]) -> Reading:
    found = first(env, *NODELIST)
    if found is None:
        raise ConfigError(
            NODELIST[1],
            None,
            "SLURM names no node to this process",
            "Start the entrypoint with srun inside a SLURM job, or unset ENTRYPOINT_PLATFORM",
        )
    nodelist_name, nodelist_raw = found
    hosts = expand_var(nodelist_name, nodelist_raw)
    master = host(nodelist_name, hosts[0])
    nnodes = read_count(env, *NNODES, limit=NODES) or Sourced(
        len(hosts), derived(f"count of hosts in {nodelist_name}", nodelist_name)
    )
    if nnodes.value != len(hosts):
        raise ConfigError(
            nodelist_name,
            nodelist_raw,
            f"lists {len(hosts)} hosts but {nnodes.source} says {nnodes.value}",
            "Launch the step with srun so both describe the same nodes",
        )
    node_rank = read_index(env, *NODEID, limit=NODES) or Sourced(
        0, by_default("default 0 (SLURM_NODEID unset)")
    )
    notes: list[str] = [f"master is the first host of {nodelist_name} ({hosts[0]})"]
    if STEP_ID not in env and nnodes.value > 1:
        notes.append(
            f"{STEP_ID} is unset: this looks like the batch script itself, which runs on the first "
            "node only; start the entrypoint with srun so that it runs on every node"
        )

    per_node = tasks_on_each_node(env, nnodes)
    rank, local_rank = task_place(env, nnodes, per_node)
    more: dict = {
        "hosts": tuple(hosts),
        "gpus_per_node": read_count(env, *GPUS_ON_NODE, limit=GPUS),
    }
    more |= spawn_or_place(env, per_node, rank, local_rank)

    return node_reading(
        NAME,
        env,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=Sourced(master, derived(f"first host of {nodelist_name}")),
        master_port=master_port(env),
        notes=tuple(notes),
        **more,
    )


def job_identity(env: Mapping[str, str]) -> str:
    """SLURM_JOB_ID; a requeued job keeps its id, so its restart count is part of it: a node
    left over from the earlier run is not a member."""
    named = named_by(env, "SLURM_JOB_ID")
    restart = env.get("SLURM_RESTART_COUNT", "").strip()
    return f"{named} (restart {restart})" if named and restart else named
