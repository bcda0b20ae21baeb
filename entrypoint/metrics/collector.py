"""Node 0's `/metrics`: what it knows of every node, in Prometheus' text format.

Read at scrape time from node 0's Conductor (entrypoint.coordinator.conductor): nothing is computed
between scrapes, so a job nobody scrapes pays only for an idle listening socket. The HTTP server
(entrypoint.metrics.metrics_server) is one daemon thread, bounded against strangers; it reads
copies of the conductor's dictionaries (a `dict()` copy is atomic under the GIL) and never
changes them. Labels hold node numbers, host names and the job's name: no secret is ever a
label.

Per node (labels `node`, the member the platform started, and `host`): up, state, rank, seconds
since its last heartbeat, slow, and its GPUs' figures, each combined over the node's GPUs
(NODE_GPUS: mean utilization, memory, the hottest, power, the slowest SM clock, clock event
reasons, uncorrected ECC errors); per job: phase, nodes by state, spares left, restarts, world
size, seconds training. Per-GPU series are left to DCGM exporter on each node: at 1,024 nodes of
8 GPUs they made one scrape 9 MB.
"""

from __future__ import annotations

import functools
import operator
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from entrypoint.control.node_stats import GpuFigures
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.state import JOIN, RUN
from entrypoint.metrics.metrics_server import MetricsServer

PREFIX = "multinode_"
STATES = ("joining", "training", "standby", "lost")
PHASES = ("join", "run", "end")


@dataclass(frozen=True)
class Job:
    """What the metrics say of the job that the conductor does not know."""

    name: str
    platform: str
    nproc_per_node: int


def member_states(c: Conductor) -> dict[int, str]:
    """Every member node 0 has seen: joining, training, standby or lost."""
    members, lost, seats = dict(c.job.members), dict(c.job.lost), dict(c.job.seats)
    out = {m: "lost" for m in lost}
    for m, state in members.items():
        if not state.connected:
            out[m] = "lost"
        elif c.job.phase != RUN:
            out[m] = "joining"
        elif c.job.roster.elastic and m not in seats:
            out[m] = "standby"
        else:
            out[m] = "training"
    return out


# A node's GPUs in one figure each (node 0 serves 1,024 nodes; per-GPU series are DCGM
# exporter's job on each node): name: (help, NVML figure, how its GPUs combine, scale).
NODE_GPUS: dict[str, tuple[str, str, Callable, float]] = {
    "node_gpus": ("GPUs the node's heartbeat reported", "util", len, 1),
    "node_gpu_utilization_percent": ("Mean GPU utilization (NVML)", "util", statistics.fmean, 1),
    "node_gpu_memory_used_bytes": ("GPU memory used, all GPUs", "mem_used_mib", sum, 1 << 20),
    "node_gpu_memory_total_bytes": ("GPU memory, all GPUs", "mem_total_mib", sum, 1 << 20),
    "node_gpu_temperature_max_celsius": ("The hottest GPU's temperature", "temp_c", max, 1),
    "node_gpu_power_watts": ("GPU power draw, all GPUs", "power_w", sum, 1),
    "node_gpu_sm_clock_min_hertz": ("The slowest GPU's SM clock", "sm_mhz", min, 1e6),
    "node_gpu_sm_clock_max_hertz": (
        "The lowest of the GPUs' highest SM clocks",
        "sm_max_mhz",
        min,
        1e6,
    ),
    "node_gpu_clock_event_reasons": (
        "NVML's clock event reasons of any GPU, OR-ed (0x4 power cap, 0x8 hardware slowdown, "
        "0x20 software thermal, 0x40 hardware thermal, 0x80 power brake)",
        "throttle",
        lambda masks: functools.reduce(operator.or_, masks, 0),
        1,
    ),
    "node_gpu_ecc_uncorrected_errors": (
        "Uncorrected ECC errors since the driver loaded, all GPUs",
        "ecc_uncorrected",
        sum,
        1,
    ),
}


def node_gpus(gpus: Sequence[GpuFigures]) -> dict[str, float]:
    """A node's NODE_GPUS figures from its GPUs' (entrypoint.supervise.gpu_stats); a figure no GPU
    gave is left out."""
    out = {}
    for name, (_, key, combine, scale) in NODE_GPUS.items():
        figures = [value for g in gpus if (value := getattr(g, key)) is not None]
        if figures:
            out[name] = combine(figures) * scale
    return out


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=labels)


class JobCollector(Collector):
    def __init__(self, conductor: Conductor, job: Job, clock: Callable[[], float]) -> None:
        self.c, self.job, self.clock = conductor, job, clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        c, now = self.c, self.clock()
        states = member_states(c)
        seen, seats, slow = dict(c.job.seen), dict(c.job.seats), dict(c.job.slow)
        node = ["node", "host"]
        up = _gauge("node_up", "1 while node 0 hears the node, 0 once it is lost", node)
        state_g = _gauge("node_state", "The node's state, as its label, always 1", [*node, "state"])
        rank = _gauge("node_rank", "The node rank it trains in; -1 standing by or lost", node)
        beat = _gauge("node_last_heartbeat_seconds", "Seconds since its last heartbeat", node)
        slow_g = _gauge("node_slow", "1 while its GPUs lag the job's (node 0 logs why)", node)
        load = _gauge("node_cpu_load", "1-minute load average of a node without GPUs", node)
        gpu = {name: _gauge(name, doc, node) for name, (doc, _, _, _) in NODE_GPUS.items()}
        for m, st in sorted(states.items()):
            state = seen.get(m)
            host = state.host if state else "?"
            labels = [str(m), host]
            up.add_metric(labels, 0 if st == "lost" else 1)
            state_g.add_metric([*labels, st], 1)  # one sample a node: 3,072 fewer at 1,024
            seat = seats.get(m, -1) if c.job.roster.elastic else m
            rank.add_metric(labels, seat if st == "training" else -1)
            slow_g.add_metric(labels, 1 if m in slow else 0)
            if state is None:
                continue
            beat.add_metric(labels, max(0.0, now - state.last_seen))
            if state.stats.load is not None:
                load.add_metric(labels, state.stats.load)
            for name, value in node_gpus(state.stats.gpus).items():
                gpu[name].add_metric(labels, value)
        yield from (up, state_g, rank, beat, slow_g, load, *gpu.values())
        yield from self._health(states, seen)
        yield from self._ranks(seen, now)
        yield from self._job(states, now)

    def _health(self, states: dict, seen: dict) -> Iterator:
        """GPU and link events by node and kind (`xid_79`, `ecc_uncorrected`, `nic_down`...),
        and the nodes taken out of the job by a fatal one or a failed check."""
        events, sick = dict(self.c.job.health_events), dict(self.c.job.sick)
        counted = CounterMetricFamily(
            PREFIX + "node_health_events",
            "GPU and link events a node reported (XID, ECC, NVLink, NIC), by kind",
            labels=["node", "host", "event"],
        )
        for (m, kind), count in sorted(events.items()):
            state = seen.get(m)
            counted.add_metric([str(m), state.host if state else "?", kind], count)
        unhealthy = _gauge(
            "node_unhealthy",
            "1 once a fatal GPU or link event or a failed health check took the node out",
            ["node", "host"],
        )
        for m in sorted(states):
            state = seen.get(m)
            unhealthy.add_metric([str(m), state.host if state else "?"], 1 if m in sick else 0)
        yield from (counted, unhealthy)

    def _ranks(self, seen: dict, now: float) -> Iterator[GaugeMetricFamily]:
        """Every rank's steps (coordinator/rank_judgement.py), labelled by its node and host."""
        c = self.c
        ranks, slow = dict(c.job.progress.ranks), dict(c.job.slow_ranks)
        labels = ["node", "host", "rank"]
        steps = _gauge("rank_steps", "Steps the rank has made this start", labels)
        interval = _gauge("rank_step_seconds", "The rank's mean step time, recently", labels)
        last = _gauge("rank_last_step_seconds", "Seconds since the rank's last step", labels)
        lead = _gauge(
            "rank_before_backward_seconds",
            "Mean seconds a step of the rank's own work (data loading, forward: before backward, "
            "or outside JAX), recently",
            labels,
        )
        slow_g = _gauge("rank_slow", "1 while every step waits for this rank", labels)
        for (member, r), state in sorted(ranks.items()):
            member_state = seen.get(member)
            key = [str(member), member_state.host if member_state else "?", str(r)]
            steps.add_metric(key, state.steps)
            if state.interval is not None:
                interval.add_metric(key, state.interval)
            if state.steps:
                last.add_metric(key, max(0.0, now - state.last_step))
            leads = list(state.leads)[-6:]
            if leads:
                lead.add_metric(key, statistics.fmean(v for _, v in leads))
            slow_g.add_metric(key, 1 if (member, r) in slow else 0)
        yield from (steps, interval, last, lead, slow_g)

    def _job(self, states: dict[int, str], now: float) -> Iterator[GaugeMetricFamily]:
        c, job = self.c, self.job
        info = _gauge("job_info", "The job's name and platform", ["job", "platform"])
        info.add_metric([job.name, job.platform], 1)
        phase_name = {JOIN: "join", RUN: "run"}.get(c.job.phase, "end")
        phase = _gauge("job_phase", "1 for the job's phase", ["phase"])
        for name in PHASES:
            phase.add_metric([name], 1 if name == phase_name else 0)
        nodes = _gauge("job_nodes", "Nodes by state", ["state"])
        for name in STATES:
            nodes.add_metric([name], sum(1 for s in states.values() if s == name))
        expected = _gauge("job_nodes_expected", "Nodes the platform started, spares included", [])
        expected.add_metric([], c.job.expected)
        full = _gauge("job_nodes_full", "Nodes the job trains on at its full size", [])
        full.add_metric([], c.job.roster.full)
        spares = _gauge("job_spares_left", "Standby nodes ready to take a lost node's place", [])
        spares.add_metric([], sum(1 for s in states.values() if s == "standby"))
        restarts = _gauge("job_restarts", "Times every node's trainer started again", [])
        restarts.add_metric([], c.job.generation)
        training = sum(1 for s in states.values() if s == "training")
        world = _gauge("job_world_size", "Processes training now", [])
        world.add_metric([], training * job.nproc_per_node)
        since = _gauge("job_training_seconds", "Seconds since the first start of training", [])
        since.add_metric([], 0.0 if c.job.training_since is None else now - c.job.training_since)
        progress = c.job.progress
        job_steps = _gauge("job_steps", "Steps of the job: the fewest any rank has made", [])
        job_steps.add_metric([], progress.steps())
        intervals = [s.interval for s in list(progress.ranks.values()) if s.interval]
        rate = _gauge("job_steps_per_second", "Steps a second, recently (median rank)", [])
        rate.add_metric([], 1 / statistics.median(intervals) if intervals else 0.0)
        goodput = _gauge(
            "job_goodput_ratio",
            "Share of the wall time since the first step that the job spent stepping",
            [],
        )
        ratio = progress.goodput(now)
        if ratio is not None:
            goodput.add_metric([], ratio)
        hang = _gauge(
            "job_hang_timeout_seconds",
            "Seconds without a step before the job is hung (ENTRYPOINT_HANG_TIMEOUT, or learned)",
            [],
        )
        hang.add_metric([], c.hang_rule().seconds)
        yield from (info, phase, nodes, expected, full, spares, restarts, world, since)
        yield from (job_steps, rate, goodput, hang)


def registry(
    conductor: Conductor, job: Job, clock: Callable[[], float] = time.monotonic
) -> CollectorRegistry:
    out = CollectorRegistry(auto_describe=False)
    out.register(JobCollector(conductor, job, clock))
    return out


def serve(
    conductor: Conductor,
    job: Job,
    port: int,
    bind: str,
    log: Callable[[str, str], None],
    clock: Callable[[], float] = time.monotonic,
) -> MetricsServer | None:
    """Serve `/metrics` on `port` (entrypoint.metrics.metrics_server: bounded against strangers);
    a port that cannot be had is a warning, never a reason to stop the job. `clock` is the one
    the Conductor is fed (the control server's). Returns the server (its `shutdown()` stops
    it), or None."""
    from prometheus_client.exposition import generate_latest  # at the edge: node 0 only

    jobs = registry(conductor, job, clock)
    try:
        server = MetricsServer(lambda: generate_latest(jobs), port, bind)
    except OSError as error:
        log(
            "warning",
            f"ENTRYPOINT_METRICS_PORT={port}: node 0 cannot serve /metrics there "
            f"({error.strerror or error}); the job goes on without it. Pick a free port, or set "
            "ENTRYPOINT_METRICS_PORT=0 to turn metrics off",
        )
        return None
    server.start()
    return server
