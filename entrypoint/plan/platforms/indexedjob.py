"""Kubernetes Indexed Job (completionMode: Indexed): one pod per completion index.

The Job controller adds JOB_COMPLETION_INDEX (0 .. completions-1) to every container and names the
pod's host <job>-<index> (KEP-2214; https://kubernetes.io/docs/concepts/workloads/controllers/job/
#completion-mode). The number of pods and the master's address are not in the pod's environment:
the Job's pod template must state them, as ENTRYPOINT_NNODES (= completions = parallelism) and
MASTER_ADDR (<job>-0.<headless service named in spec.template.spec.subdomain>).
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms.base import (
    Reading,
    node_reading,
    read_addr,
    read_count,
    read_index,
    read_port,
    require,
)
from entrypoint.plan.values import NODES

NAME = "indexedjob"
DOCS = "https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode"

JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
NNODES = ("ENTRYPOINT_NNODES", "NNODES")
MASTER_ADDR = ("MASTER_ADDR", "ENTRYPOINT_MASTER_ADDR")
MASTER_PORT = ("MASTER_PORT",)


def detect(env: Mapping[str, str]) -> str | None:
    if env.get(JOB_COMPLETION_INDEX, "").strip():
        return f"{JOB_COMPLETION_INDEX} set (Indexed Job pod)"
    return None


def read(env: Mapping[str, str]) -> Reading:
    node_rank = require(
        read_index(env, JOB_COMPLETION_INDEX, limit=NODES), JOB_COMPLETION_INDEX, "the index"
    )
    nnodes = read_count(env, *NNODES, limit=NODES)
    if nnodes is None:
        raise ConfigError(
            NNODES[0],
            None,
            "an Indexed Job does not tell its pods how many there are",
            f"Set {NNODES[0]} in the pod template to the Job's completions",
        )
    master = read_addr(env, *MASTER_ADDR)
    if master is None and nnodes.value > 1:
        raise ConfigError(
            MASTER_ADDR[0],
            None,
            "an Indexed Job does not name its first pod",
            f"Set {MASTER_ADDR[0]}=<job>-0.<subdomain> in the pod template, with a "
            "headless Service named as spec.template.spec.subdomain",
        )
    return node_reading(
        NAME,
        env,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master,
        master_port=read_port(env, *MASTER_PORT),
        notes=(f"node rank is the pod's completion index ({JOB_COMPLETION_INDEX})",),
    )


def job_identity(env: Mapping[str, str]) -> str:
    """None: its nodes carry no variable naming the job (ENTRYPOINT_JOB_ID does)."""
    return ""
