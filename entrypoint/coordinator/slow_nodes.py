"""Slow nodes, named: one throttled or starved node slows every synchronous step of the job.

A pure function over the GPU figures the nodes' heartbeats carried (entrypoint.supervise.gpu_stats),
a few samples per node (one every 10 s): a node is slow when, in every one of its last `samples`
figures, its GPUs run well below the job's median, by utilization or by SM clock. A node is compared
with the others, never with a fixed figure: when every node is equally slow (a small model, a
data-bound job, every GPU power-capped), nobody is named. The clock event reasons NVML gives
(thermal, power brake, hardware slowdown) say why, when it knows.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

from entrypoint.control.node_stats import GpuFigures

# Below the job's median by this much, in every sample of the window.
UTIL_GAP = 20.0  # percentage points of GPU utilization
CLOCK_SHARE = 0.85  # of the median SM clock

# NVML's clock event reasons (nvmlClocksEventReason*): the ones that mean "held down". Idle,
# application clock settings, sync boost and the display clock say nothing about a fault.
REASONS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}


def news(
    before: Mapping[int, str], now: Mapping[int, str], training: Iterable[int], window: float
) -> list[tuple[str, int, str]]:
    """(level, node, text) to log: a node newly slow, once, with why; a node slow before that
    trains and keeps pace now, once."""
    out = [
        (
            "warning",
            node,
            f"is slow: {why}, for {window:g} s (ENTRYPOINT_SLOW_NODE_WINDOW). Every synchronous "
            "step waits for it: check its GPUs (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER), "
            "or replace the node",
        )
        for node, why in sorted(now.items())
        if node not in before
    ]
    still = set(training)
    out += [
        ("info", node, "keeps pace with the job again")
        for node in sorted(before)
        if node not in now and node in still
    ]
    return out


def reasons(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


def _figures(sample: Sequence[GpuFigures]) -> tuple[float, float | None, int]:
    """One node's sample (its GPUs' figures): mean utilization, the slowest GPU's SM clock (it
    sets the pace of a synchronous step), the union of the clock event reasons."""
    util = sum(g.util for g in sample) / len(sample)
    clocks = [g.sm_mhz for g in sample if g.sm_mhz]
    mask = 0
    for g in sample:
        mask |= g.throttle or 0
    return util, (min(clocks) if clocks else None), mask


def slow_nodes(
    history: Mapping[int, Sequence[Sequence[GpuFigures]]], samples: int
) -> dict[int, str]:
    """{node: why} for each node slow in all of its last `samples` samples. `history`: per node,
    its samples oldest first, each a list of its GPUs' figures (empty for a node without GPUs,
    which is never compared)."""
    recent = {node: list(series)[-samples:] for node, series in history.items()}
    windows = {
        node: [_figures(s) for s in window]
        for node, window in recent.items()
        if len(window) >= samples and all(window)
    }
    if len(windows) < 2 or samples < 1:
        return {}
    utils = {node: statistics.fmean(u for u, _, _ in w) for node, w in windows.items()}
    median_util = statistics.median(utils.values())
    clocked = {
        node: statistics.fmean(c for _, c, _ in w if c is not None)
        for node, w in windows.items()
        if all(c is not None for _, c, _ in w)
    }
    median_clock = statistics.median(clocked.values()) if len(clocked) >= 2 else None
    out = {}
    for node, window in windows.items():
        why = []
        if all(u < median_util - UTIL_GAP for u, _, _ in window):
            why.append(
                f"GPU utilization {utils[node]:.0f}% against the job's median {median_util:.0f}%"
            )
        if (
            median_clock
            and node in clocked
            and all(c is not None and c < CLOCK_SHARE * median_clock for _, c, _ in window)
        ):
            why.append(
                f"SM clock {clocked[node]:,.0f} MHz against the job's median "
                f"{median_clock:,.0f} MHz"
            )
        if why:
            mask = window[-1][2]
            named = reasons(mask)
            why.append(f"NVML says: {', '.join(named)}" if named else "NVML gives no reason")
            out[node] = "; ".join(why)
    return out
