"""The world the trainer forms is the planned one, or the job stops, saying why.

A launcher inside the command (`entrypoint run -- bash start.sh` whose script runs torchrun, a
Makefile, a Python wrapper) knows nothing of the other nodes: it starts a job of its own on each
node, and every node would train alone on the wrong world size, silently. Once the trainer's
default process group exists (`torch.distributed.init_process_group`, however the trainer,
DeepSpeed, accelerate or Lightning call it), the site hook compares its world size and this
rank with the plan (ENTRYPOINT_PLAN_FILE); on a mismatch it prints one line naming both and
what to write instead, and the process exits 2 (a configuration error: every node stops, and a
restart would not help)."""

from __future__ import annotations

import json
import os
import sys
from types import ModuleType
from typing import Any

from entrypoint import EXIT_CONFIG
from entrypoint.trainer_side.after_import import when_imported

PLAN_VARIABLE = "ENTRYPOINT_PLAN_FILE"
MISMATCH = "entrypoint: the trainer formed"  # how the node's entrypoint knows the line
ELSEWHERE = "entrypoint: the trainer would wait for"  # ... and this one
# The job's master as the trainer's process was given it, before the trainer's own code ran.
_given: tuple[str, str] | None = None


def planned(path: str | None) -> tuple[int, int, int, int] | None:
    """(world size, nodes, this node's first rank, its last) from the plan file, or None when
    there is none."""
    if not path:
        return None
    try:
        with open(path) as f:
            plan = json.load(f)
        first, last = plan["ranks"]
        return int(plan["world_size"]), int(plan["nnodes"]), int(first), int(last)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def mismatch(world: int, rank: int, plan: tuple[int, int, int, int]) -> str | None:
    """The one line when the world formed is not the planned one; None when it is."""
    size, nnodes, first, last = plan
    if world == size and first <= rank <= last:
        return None
    formed = f"rank {rank} of a world of {world} processes"
    if world == size:
        formed += f", but this node's ranks are {first}-{last}"
    return (
        f"{MISMATCH} {formed}; the job is planned as {size} processes on "
        f"{nnodes} nodes. A launcher inside the command (torchrun, python -m "
        "torch.distributed.run, accelerate launch, deepspeed, or one in a start script) "
        "started a job of its own on this node, which knows nothing of the others. Give the "
        "trainer to the entrypoint directly: entrypoint run -- python train.py ARGS (it starts "
        "torchrun with every node's values), or set the launcher with ENTRYPOINT_LAUNCHER"
    )


def _check(distributed: ModuleType) -> None:
    try:
        world, rank = distributed.get_world_size(), distributed.get_rank()
    except Exception:  # noqa: BLE001 - no group after all: nothing to compare
        return
    _refuse_if(world, rank)


def _refuse_if(world: int, rank: int) -> None:
    plan = planned(os.environ.get(PLAN_VARIABLE))
    line = mismatch(world, rank, plan) if plan is not None else None
    if line:
        print(line, file=sys.stderr, flush=True)
        os._exit(EXIT_CONFIG)


def elsewhere(init_method: object, env: Any, given: tuple[str, str] | None) -> str | None:
    """The one line when the group would rendezvous at a master that is not the one the
    trainer's process was given (`given`: MASTER_ADDR and MASTER_PORT at its start): the
    trainer set MASTER_ADDR or MASTER_PORT itself, or passed `init_method="tcp://old:29500"`.
    Nobody of this job answers there: the group would wait for its timeout, 30 minutes by
    default. None when it is the job's master, or when the trainer's start had none."""
    if given is None or not all(given):
        return None
    if isinstance(init_method, str) and init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://") :].split("?")[0].rpartition(":")
        how = f'init_method="{init_method}"'
    elif init_method in (None, "env://"):
        host, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
        how = f"MASTER_ADDR={host} MASTER_PORT={port}, set by the trainer"
    else:
        return None  # a file:// rendezvous, or another of the trainer's own
    if (host.strip("[]"), port) == (given[0].strip("[]"), given[1]):
        return None
    return (
        f"{ELSEWHERE} a master that is not this job's ({how}; this job's is {given[0]}:"
        f"{given[1]}): nobody of this job answers there, and the process group would wait for "
        "its timeout. Leave the master to the launcher: drop the trainer's own MASTER_ADDR, "
        'MASTER_PORT or init_method (init_process_group("nccl") reads the job\'s)'
    )


def _refuse_elsewhere(init_method: object) -> None:
    line = elsewhere(init_method, os.environ, _given)
    if line:
        print(line, file=sys.stderr, flush=True)
        os._exit(EXIT_CONFIG)


def _at(args: tuple[Any, ...], i: int) -> Any:
    return args[i] if len(args) > i else None


def _wrap(c10d: ModuleType) -> None:
    original = c10d.init_process_group  # type: ignore[attr-defined]
    if getattr(original, "_entrypoint_checked", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        # A world of its own, asked for by rank and size (`mp.spawn`'s processes with a master
        # of their own): refused before it forms, since it may never form (under torchrun its
        # processes look for the agent's store, which nobody serves at their master's port).
        given = [kwargs.get("world_size", _at(args, 3)), kwargs.get("rank", _at(args, 4))]
        if all(isinstance(v, int) and v >= 0 for v in given):
            _refuse_if(int(given[0]), int(given[1]))
        if kwargs.get("store", _at(args, 5)) is None:
            _refuse_elsewhere(kwargs.get("init_method", _at(args, 1)))
        result = original(*args, **kwargs)
        _check(c10d)
        return result

    init_process_group._entrypoint_checked = True  # type: ignore[attr-defined]
    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    c10d.init_process_group = init_process_group  # type: ignore[attr-defined]


def install(env: os._Environ | dict[str, str] = os.environ) -> None:
    """Check the trainer's world once it forms, when the entrypoint planned one."""
    global _given
    if env.get(PLAN_VARIABLE):
        _given = (env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""))
        # torch.distributed re-exports init_process_group from here when it is imported: the
        # name it re-exports is this wrapper.
        when_imported("torch.distributed.distributed_c10d", _wrap)
