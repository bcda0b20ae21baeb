"""Kubeflow Trainer v2 TrainJob with a torch runtime: a JobSet whose replicated job `node` is an
Indexed Job, one pod per node.

The Torch plugin (pkg/runtime/framework/plugins/torch/torch.go, names in pkg/constants) sets, in the
`node` container: PET_NNODES (numNodes), PET_NPROC_PER_NODE (numProcPerNode; "auto" unless given,
and with no GPU "auto" becomes the CPU count), PET_NODE_RANK (from the pod annotation
batch.kubernetes.io/job-completion-index), PET_MASTER_ADDR=<trainjob>-node-0-0.<trainjob>,
PET_MASTER_PORT=29500. No WORLD_SIZE, RANK or MASTER_ADDR.

Told apart from hand-started torchrun (which reads the same PET_ names) by JOB_COMPLETION_INDEX,
which the Kubernetes Job controller adds to every pod of an Indexed Job (KEP-2214), and from a
PyTorchJob by the absence of WORLD_SIZE and RANK (the registry tries pytorchjob first).
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
from entrypoint.plan.values import NODES

NAME = "trainjob"
DOCS = (
    "https://github.com/kubeflow/trainer/blob/master/pkg/runtime/framework/plugins/torch/torch.go"
)

PET_NNODES = "PET_NNODES"
PET_NODE_RANK = "PET_NODE_RANK"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
MASTER_ADDR = ("PET_MASTER_ADDR", "MASTER_ADDR")
MASTER_PORT = ("PET_MASTER_PORT", "MASTER_PORT")
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"


def detect(env: Mapping[str, str]) -> str | None:
    names = (PET_NNODES, PET_NODE_RANK, JOB_COMPLETION_INDEX)
    if all(env.get(n, "").strip() for n in names):
        return f"{PET_NNODES}, {PET_NODE_RANK} and {JOB_COMPLETION_INDEX} set (TrainJob pod)"
    return None


def read(env: Mapping[str, str]) -> Reading:
    nnodes = require(read_count(env, PET_NNODES, limit=NODES), PET_NNODES, "the number of nodes")
    node_rank = require(read_index(env, PET_NODE_RANK, limit=NODES), PET_NODE_RANK, "the node rank")
    index = read_index(env, JOB_COMPLETION_INDEX, limit=NODES)
    if index is not None and index.value != node_rank.value:
        raise ConfigError(
            PET_NODE_RANK,
            node_rank.value,
            f"differs from {JOB_COMPLETION_INDEX}={index.value}",
            "Do not set PET_NODE_RANK yourself; the Trainer derives it from the "
            "pod's completion index",
        )
    notes = [f"node rank is the pod's completion index ({PET_NODE_RANK})"]
    per_node, word = read_nproc(env, PET_NPROC_PER_NODE)
    if word:
        notes.append(word)
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
