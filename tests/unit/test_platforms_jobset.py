"""JobSet. JobSet sets no variable itself: it annotates pods (kubernetes-sigs/jobset,
api/jobset/v1alpha2/jobset_types.go keys; pkg/controllers/jobset_controller.go
labelAndAnnotateObject), the pod template maps them in with the downward API, and the child
Indexed Job adds JOB_COMPLETION_INDEX (KEP-2214). Pod DNS: <jobset>-<replicatedjob>-<job index>-
<pod index>.<subdomain>, subdomain defaulting to the JobSet name (site/content/en/docs/concepts,
"DNS hostnames for Pods"; GetSubdomain in jobset_controller.go)."""

import pytest

from entrypoint.plan import platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import jobset

# JobSet "pytorch", replicatedJob "workers" with replicas 2, parallelism 2 (4 nodes):
# pod pytorch-workers-1-0, the downward-API names mapped in the pod template.
WORKERS_1_0 = {
    "JOBSET_NAME": "pytorch",
    "REPLICATED_JOB_NAME": "workers",
    "JOB_INDEX": "1",
    "REPLICATED_JOB_REPLICAS": "2",
    "JOB_COMPLETION_INDEX": "0",
    "ENTRYPOINT_NNODES": "4",
    "HOSTNAME": "pytorch-workers-1-0",
}
# One Job (replicas 1), parallelism 4, only JOBSET_NAME and REPLICATED_JOB_NAME mapped: pod 3.
ONE_JOB = {
    "JOBSET_NAME": "pytorch",
    "REPLICATED_JOB_NAME": "workers",
    "JOB_COMPLETION_INDEX": "3",
    "ENTRYPOINT_NNODES": "4",
}


@pytest.mark.parametrize(("env", "node_rank"), [(WORKERS_1_0, 2), (ONE_JOB, 3)])
def test_reading(env, node_rank):
    r = jobset.read(env)
    assert r.platform == "jobset"
    assert (r.nnodes.value, r.node_rank.value, r.spawn.value) == (4, node_rank, True)
    assert (r.master_addr.value, r.master_port.value) == ("pytorch-workers-0-0.pytorch", 29500)


def test_master_addr_wins():
    r = jobset.read(ONE_JOB | {"MASTER_ADDR": "pytorch-leader-0-0.net"})
    assert (
        r.master_addr.value == "pytorch-leader-0-0.net"
        and str(r.master_addr.source) == "env MASTER_ADDR"
    )


def test_detect():
    assert jobset.detect(WORKERS_1_0) == "JOBSET_NAME and JOB_COMPLETION_INDEX set (JobSet pod)"
    assert jobset.detect({"JOB_COMPLETION_INDEX": "0"}) is None  # a plain Indexed Job
    assert platforms.detect(WORKERS_1_0)[0] is jobset


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({k: v for k, v in ONE_JOB.items() if k != "ENTRYPOINT_NNODES"}, "ENTRYPOINT_NNODES"),
        ({k: v for k, v in ONE_JOB.items() if k != "REPLICATED_JOB_NAME"}, "REPLICATED_JOB_NAME"),
        (
            {k: v for k, v in WORKERS_1_0.items() if k != "REPLICATED_JOB_REPLICAS"},
            "REPLICATED_JOB_REPLICAS",
        ),
        (WORKERS_1_0 | {"JOB_INDEX": "2"}, "JOB_INDEX"),
        (WORKERS_1_0 | {"ENTRYPOINT_NNODES": "5"}, "ENTRYPOINT_NNODES"),
        (WORKERS_1_0 | {"JOB_COMPLETION_INDEX": "2"}, "JOB_COMPLETION_INDEX"),
    ],
)
def test_bad_values(env, variable):
    with pytest.raises(ConfigError) as err:
        jobset.read(env)
    assert err.value.variable == variable and "\n" not in err.value.line()


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "jobset": {
        "JOBSET_NAME": "js",
        "REPLICATED_JOB_NAME": "w",
        "JOB_INDEX": "0",
        "REPLICATED_JOB_REPLICAS": "1",
        "JOB_COMPLETION_INDEX": "1",
        "ENTRYPOINT_NNODES": "2",
    },
}
