"""Kubeflow Trainer v2 TrainJob, torch runtime. The PET_ variables are what the Torch plugin's
EnforceMLPolicy puts in the `node` container (kubeflow/trainer, pkg/runtime/framework/plugins/
torch/torch.go; names and port 29500 in pkg/constants/constants.go, v2.0.0 to master);
JOB_COMPLETION_INDEX is added by the Kubernetes Job controller to Indexed Job pods (KEP-2214)."""

import pytest

from entrypoint.plan import platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import trainjob

# TrainJob "llm" with numNodes 2, numProcPerNode 8: pod llm-node-0-1.
NODE_1 = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "8",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "llm-node-0-0.llm",
    "PET_MASTER_PORT": "29500",
    "JOB_COMPLETION_INDEX": "1",
}
# numProcPerNode left out with GPUs in resourcesPerNode: "auto".
AUTO = NODE_1 | {"PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "0", "JOB_COMPLETION_INDEX": "0"}


@pytest.mark.parametrize(("env", "node_rank", "nproc"), [(NODE_1, 1, 8), (AUTO, 0, None)])
def test_reading(env, node_rank, nproc):
    r = trainjob.read(env)
    assert r.platform == "trainjob"
    assert (r.nnodes.value, r.node_rank.value) == (2, node_rank)
    assert (r.master_addr.value, r.master_port.value) == ("llm-node-0-0.llm", 29500)
    assert str(r.master_addr.source) == "env PET_MASTER_ADDR"
    assert r.spawn.value is True and r.rank is None
    assert (r.nproc_per_node.value if r.nproc_per_node else None) == nproc


def test_detect_tells_trainjob_from_hand_started_torchrun():
    assert (
        trainjob.detect(NODE_1)
        == "PET_NNODES, PET_NODE_RANK and JOB_COMPLETION_INDEX set (TrainJob pod)"
    )
    hand = {k: v for k, v in NODE_1.items() if k != "JOB_COMPLETION_INDEX"}
    assert trainjob.detect(hand) is None
    assert platforms.detect(NODE_1)[0] is trainjob
    assert platforms.detect(hand)[0].NAME == "torchrun"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        (NODE_1 | {"PET_NODE_RANK": "0"}, "PET_NODE_RANK"),
        (NODE_1 | {"PET_NODE_RANK": "2", "JOB_COMPLETION_INDEX": "2"}, "PET_NODE_RANK"),
        (NODE_1 | {"PET_NNODES": "0"}, "PET_NNODES"),
        (NODE_1 | {"PET_MASTER_PORT": "99999"}, "PET_MASTER_PORT"),
    ],
)
def test_bad_values(env, variable):
    with pytest.raises(ConfigError) as err:
        trainjob.read(env)
    assert err.value.variable == variable and variable in err.value.line()


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "trainjob": {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "auto",
        "PET_MASTER_ADDR": "tj-node-0-0.tj",
        "PET_MASTER_PORT": "29500",
        "JOB_COMPLETION_INDEX": "1",
    },
}
