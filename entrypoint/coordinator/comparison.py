"""What must be the same on every node, and the pure checks that compare nodes.

Each node sends its fingerprint to node 0 before launch (entrypoint.control.transport). Node 0
compares them all: one mismatch stops every node before any training step, with one message naming
the odd node(s) and each field that differs (the environment check users ran by hand, made
automatic). Clocks and a shared data directory ride along (synchronized clocks, the same dataset
path on every machine).

Pure: each node's fingerprint is collected at its edge (entrypoint.supervise.probe.fingerprint).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from entrypoint.control.node_fingerprint import LAYOUT, MATCHED, Fingerprint, PlannedShape

CLOCK_WARN_SECONDS = 2.0


@dataclass(frozen=True)
class Member:
    """One node (or one process, when the platform started one per GPU) as node 0 sees it."""

    id: int
    host: str
    fingerprint: Fingerprint
    clock_offset: float = 0.0  # its wall clock minus node 0's, seconds


def _name(m: Member) -> str:
    return f"node {m.id} ({m.host})"


def _diff(field: str, value: Any, reference: Any) -> str:
    if field == "packages":
        keys = sorted(set(value) | set(reference))
        parts = [
            f"{k} {value.get(k, 'absent')} vs {reference.get(k, 'absent')}"
            for k in keys
            if value.get(k) != reference.get(k)
        ]
        shown = ", ".join(parts[:6]) + (f" and {len(parts) - 6} more" if len(parts) > 6 else "")
        return f"packages: {shown}"
    return f"{field} {value} vs {reference}"


def mismatches(members: list[Member]) -> list[str]:
    """One line per odd member: the fields where it differs from the majority (node 0 breaks
    ties). Empty when every member matches."""
    if len(members) < 2:
        return []
    ordered = sorted(members, key=lambda m: m.id)
    lines = []
    odd: dict[int, list[str]] = {}
    for field in MATCHED:
        values = [
            repr(sorted(m.fingerprint.packages.items()))
            if field == "packages"
            else repr(m.fingerprint.value(field))
            for m in ordered
        ]
        counts = Counter(values)
        top = max(counts.values())
        reference_key = next(v for v in values if counts[v] == top)  # first = lowest id on ties
        reference = ordered[values.index(reference_key)]
        for member, key in zip(ordered, values, strict=True):
            if key != reference_key:
                odd.setdefault(member.id, []).append(
                    _diff(
                        field, member.fingerprint.value(field), reference.fingerprint.value(field)
                    )
                    + f" on {_name(reference)}"
                )
    by_id = {m.id: m for m in ordered}
    for member_id, diffs in sorted(odd.items()):
        lines.append(f"{_name(by_id[member_id])} differs: " + "; ".join(diffs))
    return lines


def layout_mismatches(members: list[Member], head: int = 0) -> list[str]:
    """One line per member whose plan of the job's shape differs from the majority's (node 0
    breaks ties): node count, workers per node, world size, master and port, launcher, and a
    node rank outside the node count. Node 0's own master address (the head's: member 0, or
    the member serving the job after a takeover) is not compared: it may name itself
    differently (localhost, its own IP) from how the others reach it."""
    if len(members) < 2:
        return []
    ordered = sorted(members, key=lambda m: m.id)
    shapes = {m.id: _shape(m.fingerprint.layout) for m in ordered}
    odd: dict[int, list[str]] = {}
    for field in LAYOUT:
        voters = [m for m in ordered if not (field == "master_addr" and m.id == head)]
        if len(voters) < 2 and field == "master_addr":
            continue
        values = [repr(shapes[m.id].get(field)) for m in voters]
        counts = Counter(values)
        top = max(counts.values())
        reference_key = next(v for v in values if counts[v] == top)
        reference = voters[values.index(reference_key)]
        for member, key in zip(voters, values, strict=True):
            if key != reference_key:
                odd.setdefault(member.id, []).append(
                    f"{field} {shapes[member.id].get(field)} vs "
                    f"{shapes[reference.id].get(field)} on {_name(reference)}"
                )
    nnodes = Counter(shapes[m.id].get("nnodes") for m in ordered).most_common(1)[0][0]
    for m in ordered:
        rank = shapes[m.id].get("node_rank")
        if isinstance(nnodes, int) and isinstance(rank, int) and rank >= nnodes:
            odd.setdefault(m.id, []).append(f"node_rank {rank} outside 0-{nnodes - 1}")
    by_id = {m.id: m for m in ordered}
    return [
        f"{_name(by_id[i])} plans another job shape: " + "; ".join(diffs)
        for i, diffs in sorted(odd.items())
    ]


def _shape(shape: PlannedShape | None) -> dict[str, Any]:
    """A node's planned shape by field (none: every field unknown)."""
    return asdict(shape) if shape is not None else {}


def data_mismatches(members: list[Member]) -> list[str]:
    """A configured data directory must exist everywhere and look the same (count, size)."""
    summaries = {m.id: m.fingerprint.data for m in members}
    if all(s is None for s in summaries.values()):
        return []
    lines = []
    by_id = {m.id: m for m in members}
    for member_id, summary in sorted(summaries.items()):
        if summary is None or not summary.exists:
            path = summary.path if summary is not None else "ENTRYPOINT_DATA_DIR unset"
            lines.append(f"{_name(by_id[member_id])}: data directory {path} does not exist")
    seen = Counter((s.files, s.bytes) for s in summaries.values() if s is not None and s.exists)
    if len(seen) > 1:
        common = seen.most_common(1)[0][0]
        for member_id, s in sorted(summaries.items()):
            if s is not None and s.exists and (s.files, s.bytes) != common:
                lines.append(
                    f"{_name(by_id[member_id])}: data directory {s.path} has "
                    f"{s.files} files, {s.bytes} bytes; most nodes have "
                    f"{common[0]} files, {common[1]} bytes"
                )
    return lines


def clock_problems(members: list[Member], max_skew: float) -> tuple[list[str], list[str]]:
    """(refusals, warnings): clocks more than max_skew apart refuse; above a few seconds warn."""
    refuse, warn = [], []
    for m in sorted(members, key=lambda m: m.id):
        skew = abs(m.clock_offset)
        line = f"{_name(m)}: clock {m.clock_offset:+.1f} s from node 0's"
        if skew > max_skew:
            refuse.append(line + f" (more than ENTRYPOINT_MAX_CLOCK_SKEW={max_skew:g} s)")
        elif skew > CLOCK_WARN_SECONDS:
            warn.append(line + " (checkpoint and log times will disagree; run NTP/chrony)")
    return refuse, warn
