"""SLURM: sbatch + srun, with one task per node (we spawn) or one task per GPU (SLURM spawned).

Variables: https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES
and https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from entrypoint.errors import ConfigError
from entrypoint.hostlist import expand_var
from entrypoint.platforms.base import Reading, node_reading, read_count, read_index, read_port
from entrypoint.values import Sourced, first

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

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def detect(env: Mapping[str, str]) -> str | None:
    job = first(env, *JOB_ID)
    nodes = first(env, *NODELIST)
    if job and nodes:
        return f"{job[0]} and {nodes[0]} set"
    return None


def tasks_per_node(name: str, raw: str) -> list[int]:
    """SLURM's compressed form: `8(x2),4` -> [8, 8, 4]."""
    counts: list[int] = []
    for item in raw.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if not match:
            raise ConfigError(name, raw, "not SLURM's tasks-per-node form",
                              "Expect a value like 8(x2) or 2,2; launch the step with srun")
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts


def master_port(env: Mapping[str, str]) -> Sourced[int]:
    """MASTER_PORT if set; else one derived from the job id, so two jobs sharing a node differ."""
    job = first(env, *JOB_ID)
    if first(env, *MASTER_PORT) or not (job and job[1].isdigit()):
        return read_port(env, *MASTER_PORT)
    return Sourced(15000 + int(job[1]) % 20000, f"derived from {job[0]} (15000 + id mod 20000)")


def read(env: Mapping[str, str]) -> Reading:
    nodelist_name, nodelist_raw = first(env, *NODELIST)
    hosts = expand_var(nodelist_name, nodelist_raw)
    nnodes = read_count(env, *NNODES) or Sourced(len(hosts), f"count of hosts in {nodelist_name}")
    if nnodes.value != len(hosts):
        raise ConfigError(nodelist_name, nodelist_raw,
                          f"lists {len(hosts)} hosts but {nnodes.source} says {nnodes.value}",
                          "Launch the step with srun so both describe the same nodes")
    node_rank = read_index(env, *NODEID) or Sourced(0, "default 0 (SLURM_NODEID unset)")
    notes: list[str] = [f"master is the first host of {nodelist_name} ({hosts[0]})"]
    if STEP_ID not in env and nnodes.value > 1:
        notes.append(
            f"{STEP_ID} is unset: this looks like the batch script itself, which runs on the first "
            "node only; start the entrypoint with srun so that it runs on every node"
        )

    per_node = None
    found = first(env, *TASKS_PER_NODE)
    if found:
        counts = tasks_per_node(*found)
        if len(set(counts)) > 1:
            raise ConfigError(found[0], found[1], "tasks differ between nodes",
                              "Use --ntasks-per-node=1 (or one task per GPU on every node)")
        per_node = Sourced(counts[0], f"env {found[0]}")
    else:
        ntasks = read_count(env, *NTASKS)
        if ntasks and ntasks.value % nnodes.value == 0:
            per_node = Sourced(ntasks.value // nnodes.value, f"{ntasks.source} / {nnodes.source}")

    more: dict = {
        "hosts": tuple(hosts),
        "gpus_per_node": read_count(env, *GPUS_ON_NODE),
    }
    if per_node and per_node.value > 1:
        # srun started one task per GPU itself: place this process, spawn nothing.
        more |= {
            "spawn": Sourced(False, f"{per_node.value} tasks per node ({per_node.source})"),
            "rank": read_index(env, *PROCID),
            "local_rank": read_index(env, *LOCALID),
            "nproc_per_node": per_node,
        }
        if more["rank"] is None or more["local_rank"] is None:
            raise ConfigError("SLURM_PROCID", env.get("SLURM_PROCID"),
                              "several tasks per node but no task rank",
                              "Start the entrypoint with srun, which sets SLURM_PROCID and SLURM_LOCALID")
    else:
        more["spawn"] = Sourced(True, "one task per node: the entrypoint spawns the workers")

    return node_reading(
        NAME, env,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=Sourced(hosts[0], f"first host of {nodelist_name}"),
        master_port=master_port(env),
        notes=tuple(notes),
        **more,
    )
