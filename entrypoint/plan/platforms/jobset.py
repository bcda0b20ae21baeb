"""JobSet (jobset.x-k8s.io): replicated Indexed Jobs behind one headless Service.

JobSet itself puts no variable in the pod: it labels and annotates pods
(jobset.sigs.k8s.io/jobset-name, replicatedjob-name, replicatedjob-replicas, job-index;
pkg/controllers/jobset_controller.go labelAndAnnotateObject), and each child Job is an Indexed Job
whose controller adds JOB_COMPLETION_INDEX. The pod template maps the annotations in through the
downward API under the names used across JobSet examples (JOBSET_NAME, REPLICATED_JOB_NAME,
JOB_INDEX, REPLICATED_JOB_REPLICAS), for example:

    - name: JOBSET_NAME
      valueFrom: {fieldRef: {fieldPath: "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"}}

Pod hostnames are <jobset>-<replicatedjob>-<job index>-<pod index> under the subdomain, which
defaults to the JobSet's name (site/content/en/docs/concepts "DNS hostnames for Pods"), so the
master is <jobset>-<replicatedjob>-0-0.<jobset> unless MASTER_ADDR says otherwise. All nodes are
taken to be one replicated job; the node count (replicas x parallelism) is not in the pod and
comes from ENTRYPOINT_NNODES.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms.base import (
    Reading,
    named_by,
    node_reading,
    read_addr,
    read_count,
    read_index,
    read_port,
    require,
)
from entrypoint.plan.values import NODES, Sourced, below, by_default, derived, host

NAME = "jobset"
DOCS = "https://jobset.sigs.k8s.io/docs/concepts/"

JOBSET_NAME = "JOBSET_NAME"
REPLICATED_JOB_NAME = "REPLICATED_JOB_NAME"
JOB_INDEX = "JOB_INDEX"
REPLICATED_JOB_REPLICAS = "REPLICATED_JOB_REPLICAS"
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
NNODES = ("ENTRYPOINT_NNODES", "NNODES")
MASTER_ADDR = ("MASTER_ADDR", "ENTRYPOINT_MASTER_ADDR")
MASTER_PORT = ("MASTER_PORT",)


def detect(env: Mapping[str, str]) -> str | None:
    if env.get(JOBSET_NAME, "").strip() and env.get(JOB_COMPLETION_INDEX, "").strip():
        return f"{JOBSET_NAME} and {JOB_COMPLETION_INDEX} set (JobSet pod)"
    return None


def first_pod(env: Mapping[str, str], nnodes: Sourced[int]) -> Sourced[str] | None:
    """MASTER_ADDR, else the first pod of the replicated job by its DNS name."""
    master = read_addr(env, *MASTER_ADDR)
    name, rjob = env.get(JOBSET_NAME, "").strip(), env.get(REPLICATED_JOB_NAME, "").strip()
    if master is None and name and rjob:
        master = Sourced(
            host(JOBSET_NAME, f"{name}-{rjob}-0-0.{name}"),
            derived(f"{JOBSET_NAME}-{REPLICATED_JOB_NAME}-0-0.{JOBSET_NAME} (JobSet pod DNS)"),
        )
    if master is None and nnodes.value > 1:
        raise ConfigError(
            REPLICATED_JOB_NAME,
            None,
            "is needed to name the first pod",
            f"Map {REPLICATED_JOB_NAME} from the annotation "
            "jobset.sigs.k8s.io/replicatedjob-name, or set MASTER_ADDR",
        )
    return master


def read(env: Mapping[str, str]) -> Reading:
    pod = require(
        read_index(env, JOB_COMPLETION_INDEX, limit=NODES), JOB_COMPLETION_INDEX, "the pod index"
    )
    nnodes = read_count(env, *NNODES, limit=NODES)
    if nnodes is None:
        raise ConfigError(
            NNODES[0],
            None,
            "a JobSet does not tell its pods how many there are",
            f"Set {NNODES[0]} in the pod template to replicas x parallelism",
        )
    job = read_index(env, JOB_INDEX, limit=NODES) or Sourced(
        0, by_default(f"default 0 ({JOB_INDEX} unset: one Job)", JOB_INDEX)
    )
    replicas = read_count(env, REPLICATED_JOB_REPLICAS, limit=NODES)
    if replicas is None:
        if job.value:
            raise ConfigError(
                REPLICATED_JOB_REPLICAS,
                None,
                f"unset while {JOB_INDEX}={job.value}",
                f"Map {REPLICATED_JOB_REPLICAS} from the annotation "
                "jobset.sigs.k8s.io/replicatedjob-replicas",
            )
        replicas = Sourced(
            1, by_default(f"default 1 ({REPLICATED_JOB_REPLICAS} unset)", REPLICATED_JOB_REPLICAS)
        )
    below(JOB_INDEX, job.value, REPLICATED_JOB_REPLICAS, replicas.value)
    if nnodes.value % replicas.value:
        raise ConfigError(
            nnodes.source.names(NNODES[0]),
            nnodes.value,
            f"is not a multiple of {REPLICATED_JOB_REPLICAS}={replicas.value}",
            "Give every Job of the replicated job the same parallelism",
        )
    per_job = nnodes.value // replicas.value
    if pod.value >= per_job:
        raise ConfigError(
            JOB_COMPLETION_INDEX,
            pod.value,
            f"must be below the {per_job} pods per Job ({nnodes.source} / {replicas.source})",
            f"Set {NNODES[0]} to replicas x parallelism",
        )
    node_rank = Sourced(
        job.value * per_job + pod.value,
        derived(f"{JOB_INDEX} x pods per Job + {JOB_COMPLETION_INDEX}"),
    )

    master = first_pod(env, nnodes)
    return node_reading(
        NAME,
        env,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master,
        master_port=read_port(env, *MASTER_PORT),
        notes=("all nodes are read as one replicated job; the master is its first pod",),
    )


def job_identity(env: Mapping[str, str]) -> str:
    """The JobSet's name."""
    return named_by(env, JOBSET_NAME)
