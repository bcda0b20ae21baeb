"""SkyPilot: `run` commands execute once on every node of the cluster with the node's place in
SKYPILOT_NODE_RANK, every node's IP in SKYPILOT_NODE_IPS (one per line, head node first),
SKYPILOT_NUM_NODES and SKYPILOT_NUM_GPUS_PER_NODE (the accelerator count, rounded up; 0 on CPU).
Docs: https://docs.skypilot.co/en/latest/running-jobs/environment-variables.html and
https://docs.skypilot.co/en/latest/running-jobs/distributed-jobs.html (master = first IP).
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms.base import (
    Reading,
    named_by,
    node_reading,
    read_count,
    read_hosts,
    read_index,
    read_port,
    require,
)
from entrypoint.plan.values import GPUS, NODES, Sourced, derived

NAME = "skypilot"
DOCS = "https://docs.skypilot.co/en/latest/running-jobs/environment-variables.html"

NODE_RANK = "SKYPILOT_NODE_RANK"
NODE_IPS = "SKYPILOT_NODE_IPS"
NUM_NODES = "SKYPILOT_NUM_NODES"
NUM_GPUS_PER_NODE = "SKYPILOT_NUM_GPUS_PER_NODE"
MASTER_PORT = ("MASTER_PORT",)


def detect(env: Mapping[str, str]) -> str | None:
    if env.get(NODE_RANK, "").strip() and env.get(NODE_IPS, "").strip():
        return f"{NODE_RANK} and {NODE_IPS} set"
    return None


def read(env: Mapping[str, str]) -> Reading:
    raw_ips = env.get(NODE_IPS, "")
    ips = [line.strip() for line in raw_ips.splitlines() if line.strip()]
    if not ips:
        raise ConfigError(
            NODE_IPS,
            raw_ips or None,
            "lists no node",
            "Start the entrypoint from the task's run section, where SkyPilot sets it",
        )
    ips = list(read_hosts(NODE_IPS, raw_ips.replace("\n", ","), ips))
    node_rank = require(read_index(env, NODE_RANK, limit=NODES), NODE_RANK, "the node rank")
    nnodes = read_count(env, NUM_NODES, limit=NODES) or Sourced(
        len(ips), derived(f"count of lines in {NODE_IPS}", NODE_IPS)
    )
    if nnodes.value != len(ips):
        raise ConfigError(
            NODE_IPS,
            raw_ips.replace("\n", ","),
            f"lists {len(ips)} nodes but {NUM_NODES}={nnodes.value}",
            "Start the entrypoint from the task's run section, where both describe the same nodes",
        )
    # 0 is a real answer here (a CPU task), so parse it as a count that may be zero.
    gpus = read_count(env, NUM_GPUS_PER_NODE, limit=GPUS, allow_zero=True)
    return node_reading(
        NAME,
        env,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=Sourced(ips[0], derived(f"first line of {NODE_IPS} (the head node)")),
        master_port=read_port(env, *MASTER_PORT),
        gpus_per_node=gpus,
        hosts=tuple(ips),
    )


def job_identity(env: Mapping[str, str]) -> str:
    """The task's id, the same on every node of one launch."""
    return named_by(env, "SKYPILOT_TASK_ID")
