"""Hand-started nodes with torchrun's variables: the same names users put in per-worker scripts.

torchrun reads every flag from a PET_-prefixed variable too (torch/distributed/run.py,
`env` argument action); per-worker scripts export NNODES/NODE_RANK/GPUS_PER_NODE by hand.
https://pytorch.org/docs/stable/elastic/run.html
"""

from __future__ import annotations

from collections.abc import Mapping

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
from entrypoint.plan.values import GPUS, NODES, Sourced, by_default

NAME = "torchrun"
DOCS = "https://pytorch.org/docs/stable/elastic/run.html"

NNODES = ("NNODES", "PET_NNODES")
NODE_RANK = ("NODE_RANK", "PET_NODE_RANK")
NPROC_PER_NODE = ("NPROC_PER_NODE", "PET_NPROC_PER_NODE")
GPUS_PER_NODE = ("GPUS_PER_NODE",)
MASTER_ADDR = ("MASTER_ADDR", "PET_MASTER_ADDR")
MASTER_PORT = ("MASTER_PORT", "PET_MASTER_PORT")


def detect(env: Mapping[str, str]) -> str | None:
    seen = [name for name in NNODES + NODE_RANK if env.get(name, "").strip()]
    return f"{' and '.join(seen)} set" if seen else None


def read(env: Mapping[str, str]) -> Reading:
    nproc, word = read_nproc(env, *NPROC_PER_NODE)
    notes = (word,) if word else ()
    nnodes = require(read_count(env, *NNODES, limit=NODES), "NNODES", "the number of nodes")
    node_rank = read_index(env, *NODE_RANK, limit=NODES) or Sourced(
        0, by_default("default 0 (NODE_RANK unset)")
    )
    return node_reading(
        NAME,
        env,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=read_addr(env, *MASTER_ADDR),
        master_port=read_port(env, *MASTER_PORT),
        nproc_per_node=nproc,
        gpus_per_node=read_count(env, *GPUS_PER_NODE, limit=GPUS),
        notes=notes,
    )


def job_identity(env: Mapping[str, str]) -> str:
    """None: its nodes carry no variable naming the job (ENTRYPOINT_JOB_ID does)."""
    return ""
