"""Slow nodes named (issue 25): the rule as a table (entrypoint.coordinator.slow_nodes), then node
0's Conductor fed the heartbeats of real `Stats` readers over a stand-in NVML (no GPU here): one
node's GPUs throttled is named once with NVML's reason, and again when it recovers; every node
equally slow, or a node slow for less than the window, is not named."""

from types import SimpleNamespace

import pytest
from test_conductor import joined

from entrypoint.control.actions import Log
from entrypoint.control.messages import STATS_EVERY, Beat
from entrypoint.control.node_stats import GpuFigures
from entrypoint.coordinator.slow_nodes import reasons, slow_nodes
from entrypoint.coordinator.state import Limits
from entrypoint.supervise.gpu_stats import Stats

MIB = 1 << 20
HW_THERMAL, POWER_CAP, IDLE = 0x40, 0x4, 0x1


def gpu(util=95.0, mhz=1980, throttle=0):
    return GpuFigures(util, 1, 80, sm_mhz=mhz, throttle=throttle)


def series(n, **figures):
    return [[gpu(**figures)] * 8 for _ in range(n)]


@pytest.mark.parametrize(
    ("history", "named"),
    [
        ({0: series(6), 1: series(6), 2: series(6, util=40)}, {2: "GPU utilization 40%"}),
        ({0: series(6), 1: series(6, mhz=1100, throttle=HW_THERMAL)}, {1: "SM clock 1,100 MHz"}),
        ({0: series(6, util=30), 1: series(6, util=30)}, {}),  # equally slow: nobody
        ({0: series(6, mhz=1100), 1: series(6, mhz=1100)}, {}),
        ({0: series(6), 1: series(5) + series(1, util=10)}, {}),  # one bad sample: no
        ({0: series(6), 1: series(3, util=10)}, {}),  # fewer samples than the window
        ({0: series(6), 1: series(6, util=80)}, {}),  # within 20 points of the median
        ({0: series(6), 1: [[] for _ in range(6)]}, {}),  # a node without GPUs: not compared
        ({0: series(6, util=10)}, {}),  # one node: nothing to compare with
        ({0: series(6), 1: series(6, throttle=POWER_CAP)}, {}),  # a reason alone, same pace
    ],
)
def test_the_rule(history, named):
    found = slow_nodes(history, samples=6)
    assert {n: why.split(" against")[0] for n, why in found.items()} == named, found


def test_the_reason_is_nvml_s_when_it_gives_one():
    history = {0: series(6), 1: series(6, util=20, mhz=900, throttle=HW_THERMAL | IDLE)}
    why = slow_nodes(history, samples=6)[1]
    assert why == (
        "GPU utilization 20% against the job's median 58%; SM clock 900 MHz against the job's "
        "median 1,440 MHz; NVML says: hardware thermal slowdown"
    )
    assert reasons(IDLE) == []


class Nvml:
    """pynvml's calls that Stats makes, for one node's GPUs; `throttled` holds them down."""

    def __init__(self, throttled=False):
        self.throttled = throttled

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=61 if self.throttled else 97)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=70 * 1024 * MIB, total=80 * 1024 * MIB)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 91 if self.throttled else 64

    def nvmlDeviceGetPowerUsage(self, handle):
        return 350_000 if self.throttled else 690_000  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1215 if self.throttled else 1980

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return 1980

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return HW_THERMAL if self.throttled else 0

    def nvmlDeviceGetTotalEccErrors(self, handle, kind, counter):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # a GPU without ECC: left out


def test_stats_read_every_figure_nvml_gives():
    (figures,) = Stats(("0",), nvml=Nvml(throttled=True)).read().gpus
    assert figures == GpuFigures(
        util=61,
        mem_used_mib=70 * 1024,
        mem_total_mib=80 * 1024,
        temp_c=91,
        power_w=350,
        sm_mhz=1215,
        sm_max_mhz=1980,
        throttle=HW_THERMAL,
    )
    assert figures.ecc_uncorrected is None  # this GPU gives none: left out of the wire too
    assert "ecc_uncorrected" not in figures.to_wire()


def run(nodes: dict[int, Nvml], beats: int, window: float = 60):
    """Node 0's conductor over `beats` rounds of every node's beat (one per STATS_EVERY)."""
    limits = Limits(join_timeout=60, heartbeat_timeout=30, monitor_interval=0, slow_window=window)
    c = joined(len(nodes), limits=limits)
    stats = {m: Stats(tuple(str(i) for i in range(8)), nvml=nvml) for m, nvml in nodes.items()}
    logs = []
    for i in range(1, beats + 1):
        now = 1.0 + i * STATS_EVERY
        for m in nodes:
            c.beat(m, Beat(stats[m].read()), now)
        logs += [a.text for a in c.tick(now) if isinstance(a, Log)]
    return c, logs


def test_a_throttled_node_is_named_once_with_nvml_s_reason():
    throttled = Nvml(throttled=True)
    c, logs = run({0: Nvml(), 1: throttled, 2: Nvml()}, beats=9)
    slow = [line for line in logs if "is slow" in line]
    assert slow == [
        "node 1 (worker-1) is slow: GPU utilization 61% against the job's median 97%; SM clock "
        "1,215 MHz against the job's median 1,980 MHz; NVML says: hardware thermal slowdown, for "
        "60 s (ENTRYPOINT_SLOW_NODE_WINDOW). Every synchronous step waits for it: check its GPUs "
        "(nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER), or replace the node"
    ]
    assert c.job.slow.keys() == {1}
    throttled.throttled = False
    c2_logs = []
    for i in range(10, 13):
        now = 1.0 + i * STATS_EVERY
        for m in (0, 1, 2):
            c.beat(m, Beat(Stats(("0",), nvml=throttled if m == 1 else Nvml()).read()), now)
        c2_logs += [a.text for a in c.tick(now) if isinstance(a, Log)]
    assert "node 1 (worker-1) keeps pace with the job again" in c2_logs
    assert c.job.slow == {}


def test_every_node_equally_throttled_is_not_named():
    _, logs = run({0: Nvml(True), 1: Nvml(True)}, beats=12)
    assert not [line for line in logs if "slow" in line]


def test_a_node_slow_for_less_than_the_window_is_not_named():
    _, logs = run({0: Nvml(), 1: Nvml(True)}, beats=5, window=60)
    assert not [line for line in logs if "slow" in line]
