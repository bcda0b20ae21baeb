"""Node 0's state is one record: `JobState` written whole (pickled, as a store would hold it) and
read back mid-job gives a Conductor that decides every later event as the original does. What
node 0's replacement needs: no callback, no state outside the record."""

import pickle
from collections import deque

from fingerprints import fingerprint
from test_seating import FP

from entrypoint.control.messages import Beat, Exit, Hello
from entrypoint.control.node_stats import GpuFigures, NodeStats
from entrypoint.control.rank_records import Failure, RankReport
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.roster import Roster
from entrypoint.coordinator.state import Limits

# a restart left, a failure window, the monitor table and slow nodes judged as the job goes
LIMITS = Limits(
    join_timeout=60,
    heartbeat_timeout=30,
    max_restarts=1,
    failure_window=3.0,
    monitor_interval=10,
    slow_window=20,
)


def hello(member: int) -> Hello:
    return Hello(member, f"worker-{member}", fingerprint(FP), 1000.0)


def ranks(member: int, steps: int) -> tuple[RankReport, ...]:
    return tuple(RankReport(member * 2 + r, steps, 0.1, 0.01, 0.2) for r in range(2))


def later(c: Conductor) -> list:
    """Everything after the snapshot: beats, a failure in its window, the standby lost, the
    clock, the restart and its hellos; every action each event gave."""
    said = []
    gpus = NodeStats((GpuFigures(90.0, 1, 80, sm_mhz=1980),) * 8)
    for t in range(20, 40):
        for m in (0, 1, 2):
            said += c.beat(m, Beat(gpus, ranks(m, t) if m < 2 else None), now=float(t))
        said += c.tick(float(t) + 0.5)
    said += c.exited(1, Exit(1, failure=Failure(rank=3, exitcode=1, time=1040.0)), now=40.0)
    said += c.closed(2, now=40.5)
    said += c.tick(45.0)
    for m in (0, 1):
        said += c.hello(m, hello(m), now=46.0, wall_now=1000.0)
    return said


def test_the_job_state_written_whole_and_read_back_decides_as_the_original():
    c = Conductor(3, LIMITS, 0.0, roster=Roster(3, 2, 2))
    for m in (0, 1, 2):
        c.hello(m, hello(m), now=1.0, wall_now=1000.0)
    for t in range(2, 20):
        for m in (0, 1):
            c.beat(m, Beat(NodeStats(load=1.0), ranks(m, t)), now=float(t))
        c.tick(float(t) + 0.5)
    assert c.job.phase == "run" and c.job.progress.ranks  # mid-job, with steps to judge
    restored = Conductor.resume(pickle.loads(pickle.dumps(c.job)))
    original = later(c)
    kinds = {type(a.message).__name__ for a in original if hasattr(a, "message")}
    assert {"Restart", "Go"} <= kinds, original  # the events after the snapshot decide things
    assert later(restored) == original
    assert plain(restored.job) == plain(c.job)


def plain(value):
    """A state as nested plain values, to compare two of them whole."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | deque):
        return [plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(plain(v) for v in value)
    if hasattr(value, "__dict__"):
        return {type(value).__name__: plain(vars(value))}
    return value
