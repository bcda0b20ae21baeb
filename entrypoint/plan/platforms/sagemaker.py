"""Amazon SageMaker training jobs, as the SageMaker training toolkit exports them to the program:
SM_HOSTS (JSON list of container host names, algo-1, algo-2, ...), SM_CURRENT_HOST, SM_NUM_GPUS.

The toolkit (aws/sagemaker-training-toolkit, src/sagemaker_training/environment.py and
torch_distributed.py) takes the first host of the list as master and the current host's position
in the list as node rank; the list comes from /opt/ml/input/config/resourceconfig.json, which
SageMaker writes sorted. The same is done here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms.base import (
    Reading,
    named_by,
    node_reading,
    read_count,
    read_hosts,
    read_port,
)
from entrypoint.plan.values import GPUS, Sourced, derived, first

NAME = "sagemaker"
DOCS = "https://github.com/aws/sagemaker-training-toolkit/blob/master/ENVIRONMENT_VARIABLES.md"

HOSTS = "SM_HOSTS"
CURRENT_HOST = "SM_CURRENT_HOST"
NUM_GPUS = "SM_NUM_GPUS"
MASTER_PORT = ("MASTER_PORT",)


def detect(env: Mapping[str, str]) -> str | None:
    if env.get(HOSTS, "").strip() and env.get(CURRENT_HOST, "").strip():
        return f"{HOSTS} and {CURRENT_HOST} set"
    return None


def hosts(raw: str | None) -> list[str]:
    try:
        parsed = json.loads(raw or "")
    except (ValueError, RecursionError):  # RecursionError: [[[[...]]]] nested too deep
        parsed = None
    if not (
        isinstance(parsed, list)
        and parsed
        and all(isinstance(h, str) and h.strip() for h in parsed)
    ):
        shown = raw if raw is None or len(raw) <= 200 else raw[:200] + "..."
        raise ConfigError(
            HOSTS,
            shown,
            "not a JSON list of host names",
            'Expect a value like ["algo-1","algo-2"], as SageMaker sets it',
        )
    return list(read_hosts(HOSTS, raw or "", [h.strip() for h in parsed]))


def read(env: Mapping[str, str]) -> Reading:
    found = first(env, HOSTS)
    listed = hosts(found[1] if found else None)
    current = (first(env, CURRENT_HOST) or ("", ""))[1]
    if current not in listed:
        shown = listed if len(listed) <= 8 else [*listed[:8], "..."]
        raise ConfigError(
            CURRENT_HOST,
            current or None,
            f"is not one of {HOSTS}={shown}",
            f"Run inside the SageMaker training container, where {CURRENT_HOST} "
            f"names one of {HOSTS}",
        )
    return node_reading(
        NAME,
        env,
        nnodes=Sourced(len(listed), derived(f"count of hosts in {HOSTS}", HOSTS)),
        node_rank=Sourced(
            listed.index(current), derived(f"position of {CURRENT_HOST} in {HOSTS}", CURRENT_HOST)
        ),
        master_addr=Sourced(listed[0], derived(f"first host of {HOSTS}")),
        master_port=read_port(env, *MASTER_PORT),
        # 0 on CPU instances: a count that may be zero.
        gpus_per_node=read_count(env, NUM_GPUS, limit=GPUS, allow_zero=True),
        hosts=tuple(listed),
    )


def job_identity(env: Mapping[str, str]) -> str:
    """The training job's name."""
    return named_by(env, "TRAINING_JOB_NAME")
