"""Kubernetes Indexed Job: the Job controller adds JOB_COMPLETION_INDEX to each pod and names its
host <job>-<index> (kubernetes/enhancements keps/sig-apps/2214-indexed-job "Pod detail";
https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode). The node count and
master are the pod template's own ENTRYPOINT_NNODES and MASTER_ADDR."""

import pytest

from entrypoint.plan import platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import indexedjob

# Job "train", completions=parallelism=4, subdomain "train" with a headless Service: pod index 3.
POD_3 = {
    "JOB_COMPLETION_INDEX": "3",
    "ENTRYPOINT_NNODES": "4",
    "MASTER_ADDR": "train-0.train",
    "HOSTNAME": "train-3",
}


def test_reading():
    r = indexedjob.read(POD_3)
    assert r.platform == "indexedjob"
    assert (r.nnodes.value, r.node_rank.value, r.spawn.value) == (4, 3, True)
    assert (r.master_addr.value, r.master_port.value) == ("train-0.train", 29500)
    assert str(r.nnodes.source) == "env ENTRYPOINT_NNODES"


def test_single_pod_needs_no_master():
    r = indexedjob.read({"JOB_COMPLETION_INDEX": "0", "ENTRYPOINT_NNODES": "1"})
    assert r.master_addr is None


def test_detect():
    assert indexedjob.detect(POD_3) == "JOB_COMPLETION_INDEX set (Indexed Job pod)"
    assert indexedjob.detect({"HOSTNAME": "x"}) is None
    assert platforms.detect(POD_3)[0] is indexedjob


@pytest.mark.parametrize(
    ("env", "variable", "words"),
    [
        (
            {"JOB_COMPLETION_INDEX": "3", "MASTER_ADDR": "train-0.train"},
            "ENTRYPOINT_NNODES",
            "Set ENTRYPOINT_NNODES in the pod template",
        ),
        (
            {"JOB_COMPLETION_INDEX": "3", "ENTRYPOINT_NNODES": "4"},
            "MASTER_ADDR",
            "<job>-0.<subdomain>",
        ),
        (POD_3 | {"JOB_COMPLETION_INDEX": "4"}, "JOB_COMPLETION_INDEX", "must be below"),
        (POD_3 | {"ENTRYPOINT_NNODES": "four"}, "ENTRYPOINT_NNODES", "positive"),
    ],
)
def test_bad_values(env, variable, words):
    with pytest.raises(ConfigError) as err:
        indexedjob.read(env)
    assert err.value.variable == variable
    assert words in err.value.line() and "\n" not in err.value.line()


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "indexedjob": {
        "JOB_COMPLETION_INDEX": "1",
        "ENTRYPOINT_NNODES": "2",
        "MASTER_ADDR": "train-0.train",
    },
}
