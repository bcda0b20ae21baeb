"""Volcano Job plugins, volcano-sh/volcano pkg/controllers/job/plugins:
env/const.go + env.go (VK_TASK_INDEX, VC_TASK_INDEX = pod index in its task), svc/const.go + svc.go
(VC_<TASK>_HOSTS comma-separated <job>-<task>-<i>.<job>, VC_<TASK>_NUM, task name upper-cased with
- as _), distributed-framework/pytorch/pytorch.go (MASTER_ADDR <job>-master-0.<job>, MASTER_PORT
23456, WORLD_SIZE = master + worker pods, RANK master 0 / worker i+1; the webhook turns svc on,
pkg/webhooks/admission/jobs/mutate/mutate_job.go)."""

import pytest

from entrypoint.plan import platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import volcano

# plugins: {pytorch: ["--master=master", "--worker=worker", "--port=23456"]}, master x1, worker x1;
# the worker pod ddp-worker-0 (env plugin off).
PYTORCH_WORKER = {
    "MASTER_ADDR": "ddp-master-0.ddp",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "2",
    "RANK": "1",
    "VC_MASTER_HOSTS": "ddp-master-0.ddp",
    "VC_MASTER_NUM": "1",
    "VC_WORKER_HOSTS": "ddp-worker-0.ddp",
    "VC_WORKER_NUM": "1",
}
# plugins: {env: [], svc: []}, one task "gpu-nodes" with 3 replicas: pod train-gpu-nodes-2.
ENV_SVC = {
    "VK_TASK_INDEX": "2",
    "VC_TASK_INDEX": "2",
    "VC_GPU_NODES_HOSTS": "train-gpu-nodes-0.train,train-gpu-nodes-1.train,train-gpu-nodes-2.train",
    "VC_GPU_NODES_NUM": "3",
}
TWO_TASKS = ENV_SVC | {"VC_PS_HOSTS": "train-ps-0.train", "VC_PS_NUM": "1"}


def test_pytorch_plugin():
    r = volcano.read(PYTORCH_WORKER)
    assert r.platform == "volcano"
    assert (r.nnodes.value, r.node_rank.value, r.spawn.value) == (2, 1, True)
    assert (r.master_addr.value, r.master_port.value) == ("ddp-master-0.ddp", 23456)
    assert "read as pods" in r.notes[0]


def test_env_and_svc_plugins():
    r = volcano.read(ENV_SVC)
    assert (r.nnodes.value, r.node_rank.value) == (3, 2)
    assert str(r.node_rank.source) == "env VC_TASK_INDEX"
    assert (r.master_addr.value, r.master_port.value) == ("train-gpu-nodes-0.train", 29500)
    assert str(r.master_addr.source) == "first host of VC_GPU_NODES_HOSTS"
    assert len(r.hosts) == 3


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        (PYTORCH_WORKER, "VC_MASTER_HOSTS and RANK set (Volcano pytorch plugin)"),
        (ENV_SVC, "VC_TASK_INDEX and VC_GPU_NODES_HOSTS set (Volcano env and svc plugins)"),
        ({"VC_TASK_INDEX": "0"}, "VC_TASK_INDEX set (Volcano job)"),
        ({"WORLD_SIZE": "2", "RANK": "1"}, None),
    ],
)
def test_detect(env, reason):
    assert volcano.detect(env) == reason


def test_registry_order():
    assert platforms.detect(PYTORCH_WORKER)[0] is volcano  # not commercial
    assert platforms.detect(ENV_SVC)[0] is volcano


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        (TWO_TASKS, "VC_TASK_INDEX"),
        ({"VC_TASK_INDEX": "0"}, "VC_TASK_INDEX"),
        (ENV_SVC | {"VC_TASK_INDEX": "3", "VK_TASK_INDEX": "3"}, "VC_TASK_INDEX"),
        (ENV_SVC | {"VC_GPU_NODES_NUM": "4"}, "VC_GPU_NODES_HOSTS"),
        (PYTORCH_WORKER | {"RANK": "2"}, "RANK"),
        (PYTORCH_WORKER | {"MASTER_PORT": "-1"}, "MASTER_PORT"),
    ],
)
def test_bad_values(env, variable):
    with pytest.raises(ConfigError) as err:
        volcano.read(env)
    assert err.value.variable == variable and "\n" not in err.value.line()


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "volcano": {
        "WORLD_SIZE": "2",
        "RANK": "1",
        "MASTER_ADDR": "vj-master-0.vj",
        "MASTER_PORT": "23456",
        "VC_MASTER_HOSTS": "vj-master-0.vj",
        "VC_MASTER_NUM": "1",
        "VC_WORKER_HOSTS": "vj-worker-0.vj",
        "VC_WORKER_NUM": "1",
        "VC_TASK_INDEX": "0",
    },
    "volcano-svc": {
        "VC_TASK_INDEX": "1",
        "VC_NODE_HOSTS": "vj-node-0.vj,vj-node-1.vj",
        "VC_NODE_NUM": "2",
    },
}
