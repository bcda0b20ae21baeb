"""AWS Batch multi-node parallel jobs: https://docs.aws.amazon.com/batch/latest/userguide/
mnp-env-vars.html. AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is set on child nodes only.
The other AWS_BATCH_* below are the standard job variables, shown for realism, not read."""

import pytest

from entrypoint.plan import platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import awsbatch

MAIN = {
    "AWS_BATCH_JOB_ID": "b2a9#0",
    "AWS_BATCH_JQ_NAME": "gpu",
    "AWS_BATCH_CE_NAME": "p4d",
    "AWS_BATCH_JOB_ATTEMPT": "1",
    "AWS_BATCH_JOB_NODE_INDEX": "0",
    "AWS_BATCH_JOB_NUM_NODES": "2",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
}
CHILD = MAIN | {
    "AWS_BATCH_JOB_ID": "b2a9#1",
    "AWS_BATCH_JOB_NODE_INDEX": "1",
    "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.17",
}
# nodeProperties.mainNode = 2 of 4: the main node becomes node rank 0.
MAIN_IS_2 = {
    "AWS_BATCH_JOB_NODE_INDEX": "2",
    "AWS_BATCH_JOB_NUM_NODES": "4",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "2",
}
INDEX_1_MAIN_2 = MAIN_IS_2 | {
    "AWS_BATCH_JOB_NODE_INDEX": "1",
    "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.9",
}


@pytest.mark.parametrize(
    ("env", "nnodes", "node_rank", "master"),
    [
        (MAIN, 2, 0, "127.0.0.1"),
        (CHILD, 2, 1, "10.0.1.17"),
        (MAIN_IS_2, 4, 0, "127.0.0.1"),
        (INDEX_1_MAIN_2, 4, 3, "10.0.1.9"),
    ],
)
def test_reading(env, nnodes, node_rank, master):
    r = awsbatch.read(env)
    assert r.platform == "awsbatch"
    assert (r.nnodes.value, r.node_rank.value, r.master_addr.value) == (nnodes, node_rank, master)
    assert r.master_port.value == 29500 and r.spawn.value is True


def test_main_node_is_its_own_master():
    r = awsbatch.read(MAIN)
    assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is set on the others only" in str(
        r.master_addr.source
    )


def test_detect():
    assert awsbatch.detect(CHILD) == (
        "AWS_BATCH_JOB_NODE_INDEX and AWS_BATCH_JOB_NUM_NODES set (multi-node parallel job)"
    )
    assert awsbatch.detect({"AWS_BATCH_JOB_ID": "x"}) is None  # a single-node Batch job
    assert platforms.detect(CHILD)[0] is awsbatch


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        (
            {k: v for k, v in CHILD.items() if "IPV4" not in k},
            "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS",
        ),
        (CHILD | {"AWS_BATCH_JOB_NODE_INDEX": "2"}, "AWS_BATCH_JOB_NODE_INDEX"),
        (CHILD | {"AWS_BATCH_JOB_MAIN_NODE_INDEX": "5"}, "AWS_BATCH_JOB_MAIN_NODE_INDEX"),
        (CHILD | {"AWS_BATCH_JOB_NUM_NODES": "0"}, "AWS_BATCH_JOB_NUM_NODES"),
        (CHILD | {"MASTER_PORT": "port"}, "MASTER_PORT"),
    ],
)
def test_bad_values(env, variable):
    with pytest.raises(ConfigError) as err:
        awsbatch.read(env)
    assert err.value.variable == variable and "\n" not in err.value.line()


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "awsbatch": {
        "AWS_BATCH_JOB_NODE_INDEX": "1",
        "AWS_BATCH_JOB_NUM_NODES": "2",
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.0.1",
    },
}
