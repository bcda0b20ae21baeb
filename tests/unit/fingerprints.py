"""Fingerprints for the tests of node 0's comparison: `fingerprint(fields)` from a dict that
names only what a test is about (as the tests wrote them when a fingerprint was a dict), every
other field at the record's default, `data` and `layout` as their records."""

from __future__ import annotations

from typing import Any

from entrypoint.control.node_fingerprint import DataSummary, Fingerprint, PlannedShape

LAYOUT = {
    "nnodes": 2,
    "node_rank": 0,
    "nproc_per_node": 8,
    "world_size": 16,
    "master_addr": "node-0",
    "master_port": 29500,
    "launcher": "torchrun",
}


def fingerprint(fields: dict[str, Any]) -> Fingerprint:
    given = dict(fields)
    data = given.pop("data", None)
    layout = given.pop("layout", None)
    return Fingerprint(
        **given,
        data=DataSummary(**data) if data is not None else None,
        layout=PlannedShape(**(LAYOUT | layout)) if layout is not None else None,
    )
