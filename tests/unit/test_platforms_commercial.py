"""Container platforms giving WORLD_SIZE = nodes, RANK = node index (seed 002's table:
WORLD_SIZE=2, RANK=0|1, MASTER_ADDR=jo-...-worker-0, MASTER_PORT=29500), and the same names
when they count processes (torchrun's worker variables:
https://pytorch.org/docs/stable/elastic/run.html#environment-variables)."""

import pytest

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import commercial

SEED_002 = {
    "WORLD_SIZE": "2",
    "RANK": "1",
    "MASTER_ADDR": "jo-dbxfe2k2l635222i-worker-0",
    "MASTER_PORT": "29500",
}
PER_PROCESS = {
    "WORLD_SIZE": "16",
    "RANK": "11",
    "LOCAL_RANK": "3",
    "LOCAL_WORLD_SIZE": "8",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_nodes_reading():
    r = commercial.read(SEED_002)
    assert (r.nnodes.value, r.node_rank.value, r.spawn.value) == (2, 1, True)
    assert r.master_addr.value == "jo-dbxfe2k2l635222i-worker-0"
    assert "read as the number of nodes" in r.notes[0]


def test_processes_reading_from_local_variables():
    r = commercial.read(PER_PROCESS)
    assert (r.nnodes.value, r.node_rank.value, r.spawn.value) == (2, 1, False)
    assert (r.rank.value, r.local_rank.value, r.nproc_per_node.value) == (11, 3, 8)
    assert "number of processes" in r.notes[0]


def test_forced_reading():
    r = commercial.read(SEED_002 | {"ENTRYPOINT_WORLD_SIZE_MEANS": "processes"})
    assert (r.nnodes.value, r.spawn.value, r.rank.value) == (2, False, 1)
    assert "forced by ENTRYPOINT_WORLD_SIZE_MEANS=processes" in r.notes[0]


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        (SEED_002 | {"RANK": "2"}, "RANK"),
        (SEED_002 | {"WORLD_SIZE": "-1"}, "WORLD_SIZE"),
        (SEED_002 | {"MASTER_PORT": "http"}, "MASTER_PORT"),
        (PER_PROCESS | {"WORLD_SIZE": "12", "RANK": "1"}, "WORLD_SIZE"),
        (SEED_002 | {"ENTRYPOINT_WORLD_SIZE_MEANS": "gpus"}, "ENTRYPOINT_WORLD_SIZE_MEANS"),
    ],
)
def test_bad_values(env, variable):
    with pytest.raises(ConfigError) as err:
        commercial.read(env)
    assert err.value.variable == variable


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "commercial": {
        "WORLD_SIZE": "2",
        "RANK": "1",
        "MASTER_ADDR": "job-worker-0",
        "MASTER_PORT": "29500",
    },
    "commercial-procs": {
        "WORLD_SIZE": "16",
        "RANK": "9",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "8",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
    },
}
