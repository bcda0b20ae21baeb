"""One machine with nothing set: a single node, workers on this machine.

ENTRYPOINT_NNODES (with ENTRYPOINT_NODE_RANK) may still make it one node of several, by hand:
then MASTER_ADDR, or ENTRYPOINT_MASTER_ADDR, must name node 0; no master is assumed.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.plan.platforms.base import Reading, read_addr, read_port
from entrypoint.plan.values import Sourced, by_default

NAME = "local"
DOCS = "https://pytorch.org/docs/stable/elastic/run.html#single-node-multi-worker"

MASTER_ADDR = ("MASTER_ADDR",)
MASTER_PORT = ("MASTER_PORT",)
# Variables of a multi-node job that, alone, name no platform: seeing one here most likely
# means the rest went missing (WORLD_SIZE without RANK), so the single machine is a warning.
PARTIAL = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "SLURM_JOB_ID",
    "SLURM_NNODES",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PET_NNODES",
    "SKYPILOT_NODE_IPS",
    "SM_HOSTS",
    "AWS_BATCH_JOB_NUM_NODES",
)


def _shown(raw: str) -> str:
    """A value as a warning line can hold it: short, on one line."""
    value = raw.strip()
    if len(value) <= 40 and value.isascii() and value.isprintable():
        return value
    return repr(value[:40]) + ("..." if len(value) > 40 else "")


def detect(env: Mapping[str, str]) -> str | None:
    return "no platform variables found: one machine"


def read(env: Mapping[str, str]) -> Reading:
    seen = [f"{name}={_shown(env[name])}" for name in PARTIAL if env.get(name, "").strip()]
    warnings: tuple[str, ...] = ()
    by_hand = bool(env.get("ENTRYPOINT_NNODES", "").strip())
    if seen and not by_hand:
        warning = (
            f"{', '.join(seen)} set, but no platform is recognised from it: planned as "
            "a single machine. For several nodes give each node its place too (RANK with "
            "WORLD_SIZE, NODE_RANK with NNODES; see `entrypoint --help`), or set "
            "ENTRYPOINT_PLATFORM"
        )
        warnings = (warning,)
    return Reading(
        platform=NAME,
        nnodes=Sourced(1, by_default("default 1 (no platform variables)")),
        node_rank=Sourced(0, by_default("default 0 (no platform variables)")),
        # None: a single node runs on loopback (the plan's default); several need a master.
        master_addr=read_addr(env, *MASTER_ADDR) if by_hand else None,
        master_port=read_port(env, *MASTER_PORT),
        warnings=warnings,
    )


def job_identity(env: Mapping[str, str]) -> str:
    """None: its nodes carry no variable naming the job (ENTRYPOINT_JOB_ID does)."""
    return ""
