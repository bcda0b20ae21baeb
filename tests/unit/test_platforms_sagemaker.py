"""SageMaker training, as the training toolkit exports it: aws/sagemaker-training-toolkit
ENVIRONMENT_VARIABLES.md (SM_HOSTS='["algo-1","algo-2"]', SM_CURRENT_HOST=algo-1, SM_NUM_GPUS=1);
master = first host, node rank = position of the current host (src/sagemaker_training/
environment.py get_master_hostname, torch_distributed.py --node_rank)."""

import pytest

from entrypoint.plan import platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import sagemaker

ALGO_2 = {
    "SM_HOSTS": '["algo-1","algo-2"]',
    "SM_CURRENT_HOST": "algo-2",
    "SM_NUM_GPUS": "8",
    "SM_NUM_CPUS": "96",
    "SM_NETWORK_INTERFACE_NAME": "eth0",
    "SM_MODEL_DIR": "/opt/ml/model",
}
CPU_ALGO_1 = ALGO_2 | {"SM_CURRENT_HOST": "algo-1", "SM_NUM_GPUS": "0"}


@pytest.mark.parametrize(("env", "node_rank", "gpus"), [(ALGO_2, 1, 8), (CPU_ALGO_1, 0, 0)])
def test_reading(env, node_rank, gpus):
    r = sagemaker.read(env)
    assert r.platform == "sagemaker"
    assert (r.nnodes.value, r.node_rank.value, r.gpus_per_node.value) == (2, node_rank, gpus)
    assert (r.master_addr.value, r.master_port.value) == ("algo-1", 29500)
    assert r.hosts == ("algo-1", "algo-2") and r.spawn.value is True


def test_detect():
    assert sagemaker.detect(ALGO_2) == "SM_HOSTS and SM_CURRENT_HOST set"
    assert sagemaker.detect({"SM_MODEL_DIR": "/opt/ml/model"}) is None
    assert platforms.detect(ALGO_2)[0] is sagemaker


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        (ALGO_2 | {"SM_HOSTS": "algo-1,algo-2"}, "SM_HOSTS"),
        (ALGO_2 | {"SM_HOSTS": "[]"}, "SM_HOSTS"),
        (ALGO_2 | {"SM_HOSTS": '["algo-1","algo-1"]', "SM_CURRENT_HOST": "algo-1"}, "SM_HOSTS"),
        (ALGO_2 | {"SM_CURRENT_HOST": "algo-3"}, "SM_CURRENT_HOST"),
        (ALGO_2 | {"SM_NUM_GPUS": "eight"}, "SM_NUM_GPUS"),
    ],
)
def test_bad_values(env, variable):
    with pytest.raises(ConfigError) as err:
        sagemaker.read(env)
    assert err.value.variable == variable and "\n" not in err.value.line()


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "sagemaker": {
        "SM_HOSTS": '["algo-1","algo-2"]',
        "SM_CURRENT_HOST": "algo-2",
        "SM_NUM_GPUS": "8",
    },
}
