"""Kubeflow training-operator v1 PyTorchJob. Each environment is what setPodEnv and
MasterEnvVarGenerator put in the pod (kubeflow/training-operator, pkg/controller.v1/pytorch/
envvar.go and master.go at the tag named beside the case; port 23456 = PyTorchJobDefaultPort in
pkg/apis/kubeflow.org/v1/pytorch_types.go)."""

import pytest

from entrypoint.plan import platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import pytorchjob

MASTER = {
    "MASTER_ADDR": "train-master-0",
    "MASTER_PORT": "23456",
    "PET_MASTER_ADDR": "train-master-0",
    "PET_MASTER_PORT": "23456",
}

# v1.9.0 envvar.go: Master x1 + Worker x1, nprocPerNode "8": pod train-worker-0.
V19_NPROC_8 = MASTER | {
    "PYTHONUNBUFFERED": "1",
    "WORLD_SIZE": "16",
    "RANK": "1",
    "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "8",
    "PET_NNODES": "2",
}
# v1.9.0 with nprocPerNode left out: the defaulter sets "auto", getNprocPerNodeInt gives 1.
V19_AUTO = V19_NPROC_8 | {"WORLD_SIZE": "2", "PET_NPROC_PER_NODE": "auto"}
# v1.7.0 envvar.go: same names (PET_NPROC_PER_NODE always set), Master x1 + Worker x3, nproc 4.
V17_MASTER_POD = MASTER | {
    "PYTHONUNBUFFERED": "1",
    "WORLD_SIZE": "16",
    "RANK": "0",
    "PET_NODE_RANK": "0",
    "PET_NPROC_PER_NODE": "4",
    "PET_NNODES": "4",
}
# v1.6.0 envvar.go: WORLD_SIZE = pods, no PET_*; PYTHONUNBUFFERED was "0" then.
V16 = {
    "PYTHONUNBUFFERED": "0",
    "MASTER_ADDR": "train-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "2",
    "RANK": "1",
}
# v1.9.0 elastic.go, elasticPolicy without a Master replica: rendezvous only, no rank.
ELASTIC = {
    "PYTHONUNBUFFERED": "1",
    "PET_RDZV_BACKEND": "c10d",
    "PET_RDZV_ENDPOINT": "train-worker-0:23456",
    "PET_NNODES": "1:4",
    "PET_NPROC_PER_NODE": "8",
    "PET_MAX_RESTARTS": "3",
}


@pytest.mark.parametrize(
    ("env", "nnodes", "node_rank", "nproc", "note"),
    [
        (
            V19_NPROC_8,
            2,
            1,
            8,
            "WORLD_SIZE=16 read as processes because PET_NPROC_PER_NODE=8 and PET_NNODES=2",
        ),
        (
            V19_AUTO,
            2,
            1,
            None,
            "WORLD_SIZE=2 read as pods because PET_NPROC_PER_NODE=auto is not a number",
        ),
        (
            V17_MASTER_POD,
            4,
            0,
            4,
            "WORLD_SIZE=16 read as processes because PET_NPROC_PER_NODE=4 and PET_NNODES=4",
        ),
        (V16, 2, 1, None, "WORLD_SIZE=2 read as pods: no PET_NNODES"),
    ],
)
def test_reading(env, nnodes, node_rank, nproc, note):
    r = pytorchjob.read(env)
    assert r.platform == "pytorchjob"
    assert (r.nnodes.value, r.node_rank.value) == (nnodes, node_rank)
    assert (r.master_addr.value, r.master_port.value) == ("train-master-0", 23456)
    assert r.spawn.value is True and r.rank is None and r.local_rank is None
    assert (r.nproc_per_node.value if r.nproc_per_node else None) == nproc
    assert r.gpus_per_node is None
    assert r.notes[0].startswith(note)


def test_detect():
    assert pytorchjob.detect(V19_NPROC_8) == (
        "PET_NNODES, PET_NODE_RANK, WORLD_SIZE and RANK set (training-operator v1.7+)"
    )
    assert pytorchjob.detect(ELASTIC).endswith("(elastic PyTorchJob)")
    # Before v1.7 nothing tells it from a commercial platform, whose reading is the same.
    assert pytorchjob.detect(V16) is None
    assert pytorchjob.detect({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "w-0"}) is None
    # Hand-started torchrun with PET_ names but no WORLD_SIZE/RANK.
    assert pytorchjob.detect({"PET_NNODES": "2", "PET_NODE_RANK": "1"}) is None


def test_registry_order():
    assert platforms.detect(V19_NPROC_8)[0] is pytorchjob
    assert platforms.detect(V16)[0].NAME == "commercial"
    assert platforms.detect({"PET_NNODES": "2", "PET_NODE_RANK": "1"})[0].NAME == "torchrun"


def test_commercial_reads_old_operator_the_same_way():
    old = platforms.module("commercial").read(V16)
    new = pytorchjob.read(V16)
    assert (old.nnodes.value, old.node_rank.value) == (new.nnodes.value, new.node_rank.value)


@pytest.mark.parametrize(
    ("env", "variable", "words"),
    [
        (V19_NPROC_8 | {"WORLD_SIZE": "12"}, "WORLD_SIZE", "matches neither PET_NNODES=2 or"),
        (V19_NPROC_8 | {"PET_NODE_RANK": "0"}, "PET_NODE_RANK", "differs from RANK=1"),
        (V19_NPROC_8 | {"PET_NODE_RANK": "2", "RANK": "2"}, "PET_NODE_RANK", "must be below"),
        (V19_NPROC_8 | {"PET_NNODES": "two"}, "PET_NNODES", "positive whole number"),
        (V19_NPROC_8 | {"PET_NNODES": "1:4"}, "PET_NNODES", "elastic range"),
        (V19_NPROC_8 | {"MASTER_PORT": "0"}, "MASTER_PORT", "TCP port"),
        (V16 | {"RANK": "2"}, "RANK", "must be below"),
        (ELASTIC, "PET_NODE_RANK", "elastic PyTorchJob gives no node rank"),
    ],
)
def test_bad_values(env, variable, words):
    with pytest.raises(ConfigError) as err:
        pytorchjob.read(env)
    assert err.value.variable == variable
    assert words in err.value.line() and "\n" not in err.value.line()


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "pytorchjob": {
        "WORLD_SIZE": "16",
        "RANK": "1",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "8",
        "MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "23456",
        "PET_MASTER_ADDR": "job-master-0",
        "PET_MASTER_PORT": "23456",
    },
}
