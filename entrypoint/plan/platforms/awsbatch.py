"""AWS Batch multi-node parallel jobs: one container per node.

https://docs.aws.amazon.com/batch/latest/userguide/mnp-env-vars.html:
AWS_BATCH_JOB_NODE_INDEX (0..N-1), AWS_BATCH_JOB_NUM_NODES, AWS_BATCH_JOB_MAIN_NODE_INDEX, and
AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS, which is set on the child nodes only: it is absent
on the main node itself.

torchrun's store lives on node rank 0 at the master address, so the main node must be node rank 0.
The main node may have any index (nodeProperties.mainNode), so node ranks are the indexes rotated
to start at the main node: (index - main index) mod N.

On the main node the master is the node itself: its address is 127.0.0.1. The store listens on
every interface of the main node, the child nodes reach it at the private IPv4 they are given,
and the network settings treat a master on loopback as "this node", choosing the default route.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms.base import (
    Reading,
    named_by,
    node_reading,
    read_addr,
    read_count,
    read_index,
    read_port,
    require,
)
from entrypoint.plan.values import NODES, Sourced, below, by_default, derived, env_var

NAME = "awsbatch"
DOCS = "https://docs.aws.amazon.com/batch/latest/userguide/mnp-env-vars.html"

NODE_INDEX = "AWS_BATCH_JOB_NODE_INDEX"
NUM_NODES = "AWS_BATCH_JOB_NUM_NODES"
MAIN_NODE_INDEX = "AWS_BATCH_JOB_MAIN_NODE_INDEX"
MAIN_NODE_ADDR = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
MASTER_ADDR = ("MASTER_ADDR",)  # only when AWS Batch gives none
MASTER_PORT = ("MASTER_PORT",)
SELF = "127.0.0.1"


def detect(env: Mapping[str, str]) -> str | None:
    if env.get(NODE_INDEX, "").strip() and env.get(NUM_NODES, "").strip():
        return f"{NODE_INDEX} and {NUM_NODES} set (multi-node parallel job)"
    return None


def read(env: Mapping[str, str]) -> Reading:
    nnodes = require(read_count(env, NUM_NODES, limit=NODES), NUM_NODES, "the number of nodes")
    index = require(read_index(env, NODE_INDEX, limit=NODES), NODE_INDEX, "the node index")
    below(NODE_INDEX, index.value, NUM_NODES, nnodes.value)
    main = read_index(env, MAIN_NODE_INDEX, limit=NODES) or Sourced(
        0, by_default(f"default 0 ({MAIN_NODE_INDEX} unset)", MAIN_NODE_INDEX)
    )
    below(MAIN_NODE_INDEX, main.value, NUM_NODES, nnodes.value)
    notes: list[str] = []
    if main.value:
        node_rank = Sourced(
            (index.value - main.value) % nnodes.value,
            derived(f"({NODE_INDEX} - {MAIN_NODE_INDEX}) mod {NUM_NODES}"),
        )
        notes.append(
            f"node ranks start at the main node (index {main.value}), which hosts the store"
        )
    else:
        node_rank = Sourced(index.value, env_var(NODE_INDEX))

    master = read_addr(env, MAIN_NODE_ADDR, *MASTER_ADDR)
    if master is None:
        if index.value != main.value:
            raise ConfigError(
                MAIN_NODE_ADDR,
                None,
                f"is unset on a child node ({NODE_INDEX}={index.value})",
                "Run the entrypoint as the job's container command so AWS Batch's "
                "variables reach it, or set MASTER_ADDR",
            )
        master = Sourced(
            SELF, derived(f"this is the main node ({MAIN_NODE_ADDR} is set on the others only)")
        )
        notes.append(
            "this node is the main node: the store binds here, the others connect to "
            "its private IPv4"
        )
    return node_reading(
        NAME,
        env,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master,
        master_port=read_port(env, *MASTER_PORT),
        notes=tuple(notes),
    )


def job_identity(env: Mapping[str, str]) -> str:
    """AWS_BATCH_JOB_ID: a multi-node job's node i has `<job id>#<i>`, the job is before the #."""
    return named_by(env, "AWS_BATCH_JOB_ID").split("#", 1)[0]
