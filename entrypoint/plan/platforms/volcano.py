"""Volcano Job (vcjob): pods <job>-<task>-<index>, one per node, through its job plugins.

- env plugin (pkg/controllers/job/plugins/env): VK_TASK_INDEX and VC_TASK_INDEX, the pod's index
  within its task.
- svc plugin (plugins/svc): VC_<TASK>_HOSTS (comma-separated <job>-<task>-<i>.<job>) and
  VC_<TASK>_NUM for every task, task names upper-cased with - turned into _.
- pytorch plugin (plugins/distributed-framework/pytorch, which turns svc on): MASTER_ADDR
  (<job>-master-0.<job>), MASTER_PORT (23456), WORLD_SIZE (master + worker pods) and RANK
  (master 0, worker i -> i + 1).

With the pytorch plugin its WORLD_SIZE/RANK count pods. Without it, a job of one task is read
from VC_TASK_INDEX and that task's host list (master = first host); with several tasks the pod's
own task is not named in its environment, so that is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms.base import (
    Reading,
    node_reading,
    read_addr,
    read_count,
    read_hosts,
    read_index,
    read_port,
    require,
)
from entrypoint.plan.values import NODES, Sourced, below, derived, env_var

NAME = "volcano"
DOCS = "https://github.com/volcano-sh/volcano/tree/master/pkg/controllers/job/plugins"

TASK_INDEX = ("VC_TASK_INDEX", "VK_TASK_INDEX")
HOSTS_RE = re.compile(r"^VC_(\w+)_HOSTS$")
NUM_FMT = "VC_{}_NUM"
# pytorch plugin
WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
MASTER_ADDR = ("MASTER_ADDR",)
MASTER_PORT = ("MASTER_PORT",)


def task_hosts(env: Mapping[str, str]) -> dict[str, str]:
    """{task: VC_<TASK>_HOSTS value} for every task the svc plugin described."""
    out = {}
    for name, value in env.items():
        match = HOSTS_RE.match(name)
        if match and NUM_FMT.format(match[1]) in env:
            out[match[1]] = value
    return out


def detect(env: Mapping[str, str]) -> str | None:
    index = next((n for n in TASK_INDEX if env.get(n, "").strip()), None)
    tasks = sorted(task_hosts(env))
    if tasks and env.get(RANK, "").strip():
        return f"VC_{tasks[0]}_HOSTS and {RANK} set (Volcano pytorch plugin)"
    if index and tasks:
        return f"{index} and VC_{tasks[0]}_HOSTS set (Volcano env and svc plugins)"
    if index or tasks:  # one plugin alone: recognised, so that read() says what is missing
        return f"{index or f'VC_{tasks[0]}_HOSTS'} set (Volcano job)"
    return None


def read(env: Mapping[str, str]) -> Reading:
    port = read_port(env, *MASTER_PORT)
    if env.get(WORLD_SIZE, "").strip() and env.get(RANK, "").strip():
        world = require(read_count(env, WORLD_SIZE, limit=NODES), WORLD_SIZE, "the world size")
        rank = require(read_index(env, RANK, limit=NODES), RANK, "the rank")
        below(RANK, rank.value, WORLD_SIZE, world.value)
        return node_reading(
            NAME,
            env,
            nnodes=Sourced(world.value, env_var(WORLD_SIZE, "(pods, Volcano pytorch plugin)")),
            node_rank=Sourced(rank.value, env_var(RANK, "(pod rank, Volcano pytorch plugin)")),
            master_addr=read_addr(env, *MASTER_ADDR),
            master_port=port,
            notes=(
                f"{WORLD_SIZE}={world.value} read as pods: Volcano's pytorch plugin counts "
                "master and worker pods",
            ),
        )

    tasks = task_hosts(env)
    if len(tasks) != 1:
        shown = ", ".join(f"VC_{t}_HOSTS" for t in sorted(tasks)) or "no VC_<TASK>_HOSTS"
        raise ConfigError(
            TASK_INDEX[0],
            env.get(TASK_INDEX[0]),
            f"is an index within one task, but the job has {shown}",
            "Enable Volcano's pytorch plugin (it sets WORLD_SIZE and RANK) or run "
            "all nodes as one task",
        )
    task, raw = next(iter(tasks.items()))
    hosts_name, num_name = f"VC_{task}_HOSTS", NUM_FMT.format(task)
    hosts = [h.strip() for h in raw.split(",") if h.strip()]
    count = require(
        read_count(env, num_name, limit=NODES), num_name, "the number of pods in the task"
    )
    if not hosts or count.value != len(hosts):
        raise ConfigError(
            hosts_name,
            raw,
            f"lists {len(hosts)} hosts but {num_name}={count.value}",
            "Let Volcano's svc plugin set both",
        )
    master = read_addr(env, *MASTER_ADDR)
    hosts = list(read_hosts(hosts_name, raw, hosts))
    index = require(read_index(env, *TASK_INDEX, limit=NODES), TASK_INDEX[0], "the task index")
    return node_reading(
        NAME,
        env,
        nnodes=Sourced(len(hosts), env_var(num_name)),
        node_rank=index,
        master_addr=master or Sourced(hosts[0], derived(f"first host of {hosts_name}")),
        master_port=port,
        hosts=tuple(hosts),
    )


def job_identity(env: Mapping[str, str]) -> str:
    """None: its nodes carry no variable naming the job (ENTRYPOINT_JOB_ID does)."""
    return ""
