"""Hand-started nodes with torchrun's names. Sources: torchrun's flags and their PET_ variables
(https://pytorch.org/docs/stable/elastic/run.html; torch/distributed/run.py `env` action);
seeds 001, 003 and 004 (NNODES, NODE_RANK, GPUS_PER_NODE, MASTER_ADDR, MASTER_PORT)."""

import pytest

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import torchrun

WORKER_1 = {
    "NNODES": "2",
    "NODE_RANK": "1",
    "MASTER_ADDR": "worker-0",
    "MASTER_PORT": "29500",
    "GPUS_PER_NODE": "8",
}
PET = {
    "PET_NNODES": "4",
    "PET_NODE_RANK": "3",
    "PET_MASTER_ADDR": "10.0.0.1",
    "PET_MASTER_PORT": "23456",
    "PET_NPROC_PER_NODE": "2",
}


def test_detect():
    assert torchrun.detect(WORKER_1) == "NNODES and NODE_RANK set"
    assert torchrun.detect(PET) == "PET_NNODES and PET_NODE_RANK set"
    assert torchrun.detect({"MASTER_ADDR": "x"}) is None


def test_hand_started_worker():
    r = torchrun.read(WORKER_1)
    assert (r.nnodes.value, r.node_rank.value, r.master_addr.value, r.master_port.value) == (
        2,
        1,
        "worker-0",
        29500,
    )
    assert r.gpus_per_node.value == 8 and r.nproc_per_node is None and r.spawn.value


def test_pet_variables():
    r = torchrun.read(PET)
    assert (r.nnodes.value, r.node_rank.value, r.master_addr.value, r.master_port.value) == (
        4,
        3,
        "10.0.0.1",
        23456,
    )
    assert r.nproc_per_node.value == 2 and str(r.nproc_per_node.source) == "env PET_NPROC_PER_NODE"


def test_plain_names_beat_pet():
    assert str(torchrun.read(PET | {"NODE_RANK": "0"}).node_rank.source) == "env NODE_RANK"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        (WORKER_1 | {"NODE_RANK": "2"}, "NODE_RANK"),
        (WORKER_1 | {"NNODES": "0"}, "NNODES"),
        (WORKER_1 | {"NNODES": "two"}, "NNODES"),
        (WORKER_1 | {"MASTER_PORT": "0"}, "MASTER_PORT"),
        ({"NODE_RANK": "0"}, "NNODES"),
    ],
)
def test_bad_values(env, variable):
    with pytest.raises(ConfigError) as err:
        torchrun.read(env)
    assert err.value.variable == variable


def test_nproc_words_leave_the_choice_to_the_plan():
    r = torchrun.read(PET | {"PET_NPROC_PER_NODE": "auto"})
    assert r.nproc_per_node is None and "auto" in r.notes[0]


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "torchrun": {
        "NNODES": "2",
        "NODE_RANK": "1",
        "NPROC_PER_NODE": "8",
        "GPUS_PER_NODE": "8",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    },
}
