"""SkyPilot `run` section variables: https://docs.skypilot.co/en/latest/running-jobs/
environment-variables.html (SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS one IP per line,
SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE rounded up, 0 without accelerators) and
distributed-jobs.html (MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1))."""

import pytest

from entrypoint.plan import platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import skypilot

# num_nodes: 2, accelerators: A100:8; the second node.
WORKER = {
    "SKYPILOT_NODE_RANK": "1",
    "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6",
    "SKYPILOT_NUM_NODES": "2",
    "SKYPILOT_NUM_GPUS_PER_NODE": "8",
    "SKYPILOT_TASK_ID": "sky-2024-01-01-00-00-00-000000_mycluster_1",
    "SKYPILOT_CLUSTER_INFO": '{"cluster_name": "mycluster", "cloud": "GCP"}',
}
CPU_HEAD = WORKER | {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_GPUS_PER_NODE": "0"}


@pytest.mark.parametrize(("env", "node_rank", "gpus"), [(WORKER, 1, 8), (CPU_HEAD, 0, 0)])
def test_reading(env, node_rank, gpus):
    r = skypilot.read(env)
    assert r.platform == "skypilot"
    assert (r.nnodes.value, r.node_rank.value, r.gpus_per_node.value) == (2, node_rank, gpus)
    assert (r.master_addr.value, r.master_port.value) == ("10.0.0.5", 29500)
    assert r.hosts == ("10.0.0.5", "10.0.0.6") and r.spawn.value is True


def test_trailing_newline_and_no_num_nodes():
    env = {k: v for k, v in WORKER.items() if k != "SKYPILOT_NUM_NODES"}
    r = skypilot.read(env | {"SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n"})
    assert r.nnodes.value == 2 and str(r.nnodes.source) == "count of lines in SKYPILOT_NODE_IPS"


def test_detect():
    assert skypilot.detect(WORKER) == "SKYPILOT_NODE_RANK and SKYPILOT_NODE_IPS set"
    assert skypilot.detect({"SKYPILOT_TASK_ID": "x"}) is None
    assert platforms.detect(WORKER)[0] is skypilot


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        (WORKER | {"SKYPILOT_NODE_RANK": "2"}, "SKYPILOT_NODE_RANK"),
        (WORKER | {"SKYPILOT_NODE_RANK": "-1"}, "SKYPILOT_NODE_RANK"),
        (WORKER | {"SKYPILOT_NUM_NODES": "3"}, "SKYPILOT_NODE_IPS"),
        (WORKER | {"SKYPILOT_NODE_IPS": "\n"}, "SKYPILOT_NODE_IPS"),
        (WORKER | {"SKYPILOT_NUM_GPUS_PER_NODE": "0.5"}, "SKYPILOT_NUM_GPUS_PER_NODE"),
    ],
)
def test_bad_values(env, variable):
    with pytest.raises(ConfigError) as err:
        skypilot.read(env)
    assert err.value.variable == variable and "\n" not in err.value.line()


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "skypilot": {
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NUM_GPUS_PER_NODE": "8",
    },
}
