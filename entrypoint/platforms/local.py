"""One machine with nothing set: a single node, workers on this machine."""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.platforms.base import Reading, read_port
from entrypoint.values import Sourced

NAME = "local"
DOCS = "https://pytorch.org/docs/stable/elastic/run.html#single-node-multi-worker"


def detect(env: Mapping[str, str]) -> str | None:
    return "no platform variables found: one machine"


def read(env: Mapping[str, str]) -> Reading:
    return Reading(
        platform=NAME,
        nnodes=Sourced(1, "default 1 (no platform variables)"),
        node_rank=Sourced(0, "default 0 (no platform variables)"),
        master_addr=Sourced("127.0.0.1", "default: single node, loopback"),
        master_port=read_port(env, "MASTER_PORT"),
    )
