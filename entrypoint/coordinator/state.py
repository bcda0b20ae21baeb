"""Node 0's state of the job, one record (`JobState`): every member, the phase, the seats, the
generation, the restarts left, the failures awaiting their verdict, every rank's progress. The
Conductor's rules (entrypoint.coordinator: conductor, seating, verdicts, hangs) read and change it;
/metrics reads it at scrape time. It holds no callbacks and nothing outside it is state."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from entrypoint.control.messages import Exit
from entrypoint.control.node_fingerprint import Fingerprint
from entrypoint.control.node_stats import GpuFigures, NodeStats
from entrypoint.coordinator.rank_judgement import HangRule, JobProgress, RankStack
from entrypoint.coordinator.roster import Roster


class Phase(StrEnum):
    """Node 0's phase of the job (torch elastic's WorkerState is the model). Transitions:

    JOIN -> RUN   every node said hello and the fingerprints and layouts agree (`go`)
    JOIN -> END   a node disagrees, another job's node, or the join timeout ran out
    RUN  -> JOIN  a trainer failed with restarts left, or a node rejoined: the next generation
    RUN  -> END   every node finished, a trainer failed for good, a node was lost, a signal
    END           final: the outcome is decided and every node is told
    """

    JOIN = "join"
    RUN = "run"
    END = "end"


JOIN, RUN, END = Phase.JOIN, Phase.RUN, Phase.END


@dataclass(frozen=True)
class Limits:
    join_timeout: float = 300.0
    heartbeat_timeout: float = 30.0
    max_restarts: int = 0
    max_clock_skew: float = 30.0
    monitor_interval: float = 300.0
    failure_window: float = 0.0  # seconds to wait for more failure reports before naming one
    slow_window: float = 120.0  # seconds a node's GPUs must lag the job's before it is named
    hang_timeout: float | None = None  # ENTRYPOINT_HANG_TIMEOUT; None: learned from the steps
    collective_timeout: float = 600.0  # ENTRYPOINT_COLLECTIVE_TIMEOUT: the learned one stays below
    heartbeat_interval: float = 1.0


@dataclass(frozen=True)
class Reported:
    """A member's failure, reported and awaiting its verdict (`failure_window`): its exit
    message, the code, and its place in the order the reports came."""

    exit: Exit
    code: int
    order: int


HISTORY = 64  # beats with figures kept per member: 10+ minutes at one every 10 s


@dataclass
class MemberState:
    """What node 0 knows of one member."""

    host: str
    connected: bool = True
    joined_at: float = 0.0
    last_seen: float = 0.0
    fingerprint: Fingerprint = field(default_factory=Fingerprint)
    clock_offset: float = 0.0
    exit_code: int | None = None
    stats: NodeStats = field(default_factory=NodeStats)  # its last beat's figures
    # its GPUs' figures, a beat's at a time
    history: deque[tuple[GpuFigures, ...]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    domain: str = ""  # its GPUs' NVLink domain (a GB200 NVL72 rack's): spares go to the same


def monitor_table(members: dict[int, MemberState], now: float) -> str:
    """The per-node table node 0 logs every ENTRYPOINT_MONITOR_INTERVAL."""
    rows = [f"{'node':<6}{'host':<28}{'last beat':<11}{'devices':<44}"]
    for member, state in sorted(members.items()):
        stats, gpus = state.stats, state.stats.gpus
        if gpus:
            util = sum(g.util for g in gpus) / len(gpus)
            used = sum(g.mem_used_mib for g in gpus) / 1024
            total = sum(g.mem_total_mib for g in gpus) / 1024
            devices = f"{len(gpus)} GPU, util {util:.0f}%, mem {used:.1f}/{total:.0f} GiB"
        else:
            devices = f"CPU, load {stats.load or 0:.1f}" if stats else "-"
        rows.append(
            f"{member:<6}{state.host[:27]:<28}{now - state.last_seen:>5.0f} s ago {devices}"
        )
    return "nodes:\n  " + "\n  ".join(rows)


@dataclass
class StackProbe:
    """Node 0 asked every node for its ranks' stacks: the answers so far."""

    silent: float  # seconds no rank had stepped when asked
    rule: HangRule
    deadline: float
    answers: dict[int, list[RankStack]] = field(default_factory=dict)


@dataclass
class JobState:
    """What node 0 knows of the job."""

    expected: int  # members the platform started, spares included
    limits: Limits
    roster: Roster
    join_started: float
    unit: str = "node"  # "node", or "process" when the platform started one per GPU
    address: str = "?"  # where node 0 listens, for messages
    head: int = 0  # the member serving the job: 0, or node 0's seat holder after a takeover
    knocks: int = 0  # knocks of a node that holds node 0's seat elsewhere (conductor._knocked)
    # The job's own etcd (entrypoint.consensus.embedded): how many members run one (0: none),
    # and, from the first `go`, which: "MEMBER=HOST" in the cluster's order.
    etcd_members: int = 0
    etcd: tuple[str, ...] = ()
    # Members whose connection closed with no word (no exit report, no farewell: a survivor
    # leaving a node 0 it took for lost says so first): their process ended, and the member of
    # the job's etcd they ran with it (supervise/supervisor.py's `_nobody_else`).
    gone: set[int] = field(default_factory=set)
    members: dict[int, MemberState] = field(default_factory=dict)
    phase: Phase = JOIN
    generation: int = 0
    outcome: tuple[int, str] | None = None  # (exit code, reason) once the job ended
    failures: dict[int, Reported] = field(default_factory=dict)  # by member
    decide_at: float | None = None  # when the failures reported so far are judged
    received: dict[int, int] = field(default_factory=dict)  # signal: the member that had it first
    # each member's last state, across restarts; lost and slow members, with why
    seen: dict[int, MemberState] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)
    slow: dict[int, str] = field(default_factory=dict)
    training_since: float | None = None  # the first `go`
    went: float | None = None  # this start's `go`
    progress: JobProgress = field(default_factory=JobProgress)  # every rank's steps
    probe: StackProbe | None = None  # the stacks asked for, once ranks stopped stepping
    slow_ranks: dict[tuple[int, int], str] = field(default_factory=dict)
    hang_setting_warned: bool = False  # ENTRYPOINT_HANG_TIMEOUT is not below torch's timeout
    # health (supervise/health.py): events by (member, kind); members taken out, with why
    health_events: dict[tuple[int, str], int] = field(default_factory=dict)
    sick: dict[int, str] = field(default_factory=dict)
    last_monitor: float = field(init=False)  # when the monitor table was last logged
    last_slow_check: float = field(init=False)  # when slow nodes and ranks were last judged
    units: str = field(init=False)  # "nodes" or "processes"
    seats: dict[int, int] = field(init=False)  # member: node rank, this start (roster.py)
    awaited: set[int] = field(init=False)  # the members the next `go` waits for
    join_deadline: float = field(init=False)
    restarts_left: int = field(init=False)

    def __post_init__(self) -> None:
        self.units = "processes" if self.unit == "process" else f"{self.unit}s"
        self.seats = self.roster.first()
        self.awaited = set(range(self.expected))
        self.join_deadline = self.join_started + self.limits.join_timeout
        self.restarts_left = self.limits.max_restarts
        self.last_monitor = self.last_slow_check = self.join_started

    def next_start(self, awaited: Iterable[int], now: float) -> None:
        """The next generation's join: every member says hello again before it goes ahead."""
        self.generation += 1
        self.received = {}
        self.failures, self.decide_at = {}, None
        self.phase = JOIN
        self.members.clear()
        self.progress.restart()
        self.probe = None
        self.awaited = set(awaited)
        self.join_started = now
        self.join_deadline = now + self.limits.join_timeout

    def name(self, member: int) -> str:
        state = self.members.get(member)
        return f"{self.unit} {member}" + (f" ({state.host})" if state else "")
