"""Node 0's view of the job, as a pure state machine: events in, actions out.

The actions it returns are entrypoint.control.actions'; the state it keeps is one record,
entrypoint.coordinator.state's `JobState`.

The entrypoints of all nodes talk over their own small channel (entrypoint.control.transport), which
does not depend on NCCL, gloo or the trainer. Node 0 runs the Conductor; it decides:

- join: every node says hello with its fingerprint; when all have come, they are compared
  (entrypoint.coordinator.comparison) and every node gets `go`, or `stop` with the reason. Nodes
  that never come stop the others after ENTRYPOINT_JOIN_TIMEOUT.
- run: heartbeats both ways. A node whose connection closes without an exit report (killed,
  crashed) or that stays silent past ENTRYPOINT_HEARTBEAT_TIMEOUT (paused, hung, cut off)
  is lost: every node stops with EXIT_PEERS, and node 0's log names the lost node.
- exit: a node whose trainer failed stops every node with the trainer's exit code (or, while
  ENTRYPOINT_MAX_RESTARTS allows, restarts every node's trainer together). The first failure
  is the cause: failures reported within `failure_window` seconds of each other (a worker's
  crash breaks its peers' collectives a moment later) are ordered by when each rank failed, on
  node 0's clock, and only that one is shown; while one awaits that verdict, no hang is
  named (the crash is why the others stopped stepping). When all exit 0, all are done.
- signals: a node that receives SIGTERM, SIGINT or SIGHUP (preemption of one pod, a cancelled
  job) says so at once, and node 0 passes the signal on to every node's workers, so that all
  checkpoint together within the grace period; the job ends with 128 + the signal, naming the
  node that received it.

No sockets, no clock reads: the caller passes `now` (monotonic seconds) and carries out the
returned actions. That is what makes every rule above a unit test.
"""

from __future__ import annotations

from entrypoint import STOPPING, signal_name
from entrypoint.control.actions import ALL, Action, Close, Log, Send
from entrypoint.control.messages import (
    STATS_EVERY,
    Beat,
    Done,
    Elsewhere,
    Exit,
    Health,
    Hello,
    Signal,
    Stacks,
    Stop,
)
from entrypoint.control.rank_records import RankReport
from entrypoint.coordinator import hangs, seating
from entrypoint.coordinator.rank_judgement import HangRule, ranks_text, slow_rank_news, slow_ranks
from entrypoint.coordinator.roster import Roster
from entrypoint.coordinator.slow_nodes import news, slow_nodes
from entrypoint.coordinator.state import (
    END,
    JOIN,
    RUN,
    JobState,
    Limits,
    MemberState,
    Reported,
    monitor_table,
)
from entrypoint.coordinator.verdicts import end, failure, judge, stop_message
from entrypoint.plan.errors import EXIT_CONFIG, EXIT_PEERS


class Conductor:
    """Node 0's decisions for the job: a method per event (a hello, a beat, an exit, a signal,
    the ranks' stacks, a GPU's health, a closed connection, the clock's tick), each taking `now`
    and returning the actions its caller carries out (entrypoint.control.control_server, which
    knows it as a `Mind`). The job's state is `job` (entrypoint.coordinator.state), which every
    rule reads and changes: each start's join (`seating`), the verdicts (`verdicts`) and the
    hangs (`hangs`).

    Every event takes `member` (the sender's member id, which the handshake proved), the typed
    `message` (checked by entrypoint.control.messages) and `now` (monotonic seconds), and returns
    the actions to carry out in order. None raises: whatever a node sends is judged, not trusted.
    `outcome` in `job` is set once the job's end is decided.
    """

    def __init__(
        self,
        expected: int,
        limits: Limits,
        now: float,
        *,
        unit: str = "node",
        address: str = "?",
        roster: Roster | None = None,
        etcd_members: int = 0,
    ) -> None:
        self.job = JobState(
            expected,
            limits,
            roster or Roster(expected, expected, expected),
            now,
            unit,
            address,
            etcd_members=etcd_members,
        )

    @classmethod
    def resume(cls, job: JobState) -> Conductor:
        """A Conductor that goes on from `job`: node 0's whole state, written elsewhere and read
        back (nothing of the job lives outside it)."""
        conductor = cls.__new__(cls)
        conductor.job = job
        return conductor

    # -- names -----------------------------------------------------------------------------

    def name(self, member: int) -> str:
        return self.job.name(member)

    @property
    def expected(self) -> int:
        return self.job.expected

    @property
    def ended(self) -> bool:
        return self.job.phase == END

    def health(self, member: int, message: Health, now: float) -> list[Action]:
        """A GPU or link event on a node: counted; a fatal one takes the node out of the job."""
        return seating.health(self.job, member, message, now)

    # -- events ----------------------------------------------------------------------------

    def hello(self, member: int, message: Hello, now: float, wall_now: float) -> list[Action]:
        """A node of this job (the handshake passed) says hello: join, or join again."""
        host = message.host
        if message.holds:
            return self._knocked(member, message.holds)
        if not 0 <= member < self.job.expected:
            return seating.not_planned(self.job, member, host)
        old = self.job.members.get(member)
        if (
            old is not None
            and old.connected
            and old.host != host
            and self.job.phase == JOIN
            and self.job.generation == 0
        ):
            # Two nodes at the first start with one rank. Later, a new host is a replacement
            # (the platform started the node elsewhere) and takes the rank over.
            reason = (
                f"{self.job.unit} {member} claimed by both {old.host} and {host}: give each node "
                "its own node rank (NODE_RANK, RANK or the platform's index)"
            )
            return end(self.job, EXIT_CONFIG, reason)
        if message.unhealthy:
            return seating.unhealthy(self.job, member, host, message.unhealthy, now)
        self.job.sick.pop(member, None)  # a node back healthy (serviced, or a passing problem)
        if self.job.phase == RUN and self.job.roster.elastic:
            # A spare late for the start, or a lost node its platform replaced, stands by; a
            # seated node that says hello again was restarted by its platform: the job restarts,
            # and its hello counts for the next start.
            if not seating.rejoined(self.job, member):
                return seating.standby_joins(self.job, member, message, now, wall_now)
            actions = seating.restart_for(self.job, member, now)
            return actions + self.hello(member, message, now, wall_now)
        if self.job.phase == RUN:
            # A node that comes back while the job runs was restarted by its platform: the job it
            # belonged to is gone on that node. With restarts left, the newcomer is the first
            # member of the next start, whatever became of its old connection.
            actions = failure(
                self.job,
                member,
                None,
                f"{self.name(member)} started again while the "
                "job was running (its container or pod was restarted)",
                EXIT_PEERS,
                now,
            )
            if self.job.phase == JOIN:
                actions += self.hello(member, message, now, wall_now)
            return actions
        if self.job.phase == END:
            code, reason = self.job.outcome or (EXIT_PEERS, "the job has ended")
            return [Send(member, stop_message(code, reason)), Close(member)]
        self.job.members[member] = self.job.seen[member] = MemberState(
            host=host,
            joined_at=now,
            last_seen=now,
            fingerprint=message.fingerprint,
            clock_offset=message.time - wall_now,
            domain=message.domain,
        )
        self.job.lost.pop(member, None)
        return seating.maybe_go(self.job, now)

    def _knocked(self, member: int, holds: str) -> list[Action]:
        """A node of this job that holds node 0's seat (it proved the job's token) knocks at this
        node 0's port (the server closes the knock; it is never a member): this node 0 is one
        its platform started again after a survivor took its seat. Before its job formed (the
        first join: no `go` yet), it joins that node 0 instead of serving a job nobody else
        joins. A job that formed here is this node 0's own, and the knock is only said, once;
        this node 0's own knock (its host is the platform's node 0 address) is not."""
        holder, host, _ = holds.split()
        who = f"node {holder} ({host})"
        if int(holder) == self.job.head:
            return []
        if self.job.phase == JOIN and self.job.generation == 0:
            return [
                Log("info", f"{who} knocked at this port: it holds node 0's seat"),
                Send(0, Elsewhere(holds)),
            ]
        self.job.knocks += 1  # said once: it knocks again every few seconds
        said = f"{who} says it holds node 0's seat; this job runs here"
        return [Log("warning", said)] if self.job.knocks == 1 else []

    def beat(self, member: int, message: Beat, now: float) -> list[Action]:
        """A member is alive: its GPUs' figures and its ranks' steps (hangs are judged here)."""
        state = self.job.members.get(member)
        if state is not None:
            state.last_seen = now
            if message.stats:
                state.stats = message.stats
                state.history.append(message.stats.gpus)
            if message.ranks is not None and self.job.phase == RUN and member in self.job.seats:
                reports = message.reports()
                stepped = any(s.steps for s in self.job.progress.ranks.values())
                self.job.progress.beat(member, reports, now, self.job.limits.slow_window)
                return hangs.check_setting(self.job, reports) + (
                    [] if stepped else self._first_step(member, reports, now)
                )
        return []

    def _first_step(self, member: int, reports: list[RankReport], now: float) -> list[Action]:
        """The start's first step, once, as the beats bring it: when training began, and how
        long after the `go` (a launcher's start, imports, the process group, the first batch)."""
        first = [r.rank for r in reports if r.steps > 0]
        if not first:
            return []
        went = f", {now - self.job.went:.1f} s after the go" if self.job.went is not None else ""
        start = f"restart {self.job.generation}'s" if self.job.generation else "the job's"
        return [
            Log(
                "info",
                f"training: {ranks_text([min(first)])} on {self.name(member)} made {start} first "
                f"step{went}",
            )
        ]

    def hang_rule(self) -> HangRule:
        """The hang timeout in force: ENTRYPOINT_HANG_TIMEOUT, or learned from the steps."""
        return hangs.rule(self.job)

    def stacks(self, member: int, message: Stacks, now: float) -> list[Action]:
        """A node's ranks' stacks, asked for when no rank stepped: once every node training
        has answered (or STACKS_WAIT ran out), the hang is named and acted on."""
        return hangs.answered(self.job, member, message, now)

    def _check_slow_ranks(self, now: float) -> list[Action]:
        slow = slow_ranks(self.job.progress.ranks.values(), now, self.job.limits.slow_window)
        said = slow_rank_news(self.job.slow_ranks, slow, self.job.progress.ranks.keys())
        self.job.slow_ranks = slow
        return [
            Log(level, f"{ranks_text([r])} on {self.name(m)} {text}") for level, m, r, text in said
        ]

    def exited(self, member: int, message: Exit, now: float) -> list[Action]:
        """A member's launcher ended: done, a signal's stop, or a failure (restart or end)."""
        state = self.job.members.get(member)
        code = message.code
        # A stop is a signal's only when a node received that signal (the exit message says so,
        # or another node's signal is known here): a trainer that exits 134 (abort), 139 or 130
        # by itself has failed, and its peers get SIGTERM, never SIGABRT.
        sig = (message.signal or 0) or (
            code - 128 if code > 128 and code - 128 in self.job.received else 0
        )
        if state is not None and member not in self.job.seats and self.job.phase == RUN:
            return seating.standby_lost(self.job, member, f"it exited with code {code}", now)
        if sig and self.job.phase != END and 0 <= member < self.job.expected:
            who = self.name(self.job.received.get(sig, member))
            return end(
                self.job,
                128 + sig,
                f"stopped on {signal_name(sig)}, which {who} received "
                "(preemption, or the job was cancelled): every node checkpoints and "
                "stops",
                sig=sig,
            )
        if state is None or self.job.phase == END:
            return []
        state.last_seen = now
        state.exit_code = code
        if code == 0:
            seated = [self.job.members.get(m) for m in self.job.seats]
            if self.job.phase == RUN and all(s is not None and s.exit_code == 0 for s in seated):
                self.job.phase, self.job.outcome = END, (0, "every node finished")
                done: list[Action] = [Send(ALL, Done())]
                return (
                    done
                    if self.job.expected == 1
                    else [Log("info", f"all {len(seated)} {self.job.units} finished"), *done]
                )
            return []
        self.job.failures[member] = Reported(message, code, len(self.job.failures))
        if self.job.decide_at is None:
            self.job.decide_at = now + self.job.limits.failure_window
        everyone = all(
            s.exit_code is not None or not s.connected
            for m, s in self.job.members.items()
            if m in self.job.seats
        )
        return judge(self.job, now) if now >= self.job.decide_at or everyone else []

    def signalled(self, member: int, message: Signal, now: float) -> list[Action]:
        """A node received a signal and passed it to its workers; a stopping one goes to every
        node's workers too (one pod preempted: its peers must checkpoint with it)."""
        sig = message.signal
        if member not in self.job.members or self.job.phase != RUN or sig in self.job.received:
            return []
        if member not in self.job.seats:  # a standby's pod is going away: the job goes on
            return [Log("info", f"standby {self.name(member)} received {signal_name(sig)}")]
        self.job.received[sig] = member
        if sig not in STOPPING:
            return [
                Log(
                    "info",
                    f"{self.name(member)} received {signal_name(sig)}: passed to its workers",
                )
            ]
        if self.job.failures:  # a failure awaits its verdict: the signal ends the job, no restart
            return judge(self.job, now)
        reason = f"{self.name(member)} received {signal_name(sig)}"
        return [
            Log("warning", f"{reason}: passing it to every {self.job.unit}'s workers"),
            Send(ALL, Signal(sig, reason)),
        ]

    def closed(self, member: int, now: float) -> list[Action]:
        """A member's connection closed without its exit: it is lost (a standby: logged)."""
        state = self.job.members.get(member)
        if state is not None and state.exit_code is None:
            self.job.gone.add(member)
        if self.job.phase == JOIN and self.job.generation and self.job.roster.elastic:
            return seating.lost_in_restart(self.job, member, now)
        if state is None:
            return []
        state.connected = False
        if self.job.phase == JOIN:
            del self.job.members[member]  # it may come back before the deadline
            return [
                Log(
                    "warning",
                    f"{self.job.unit} {member} ({state.host}) left before the job "
                    "started; waiting for it to come back",
                )
            ]
        if self.job.phase == RUN and member not in self.job.seats:
            return seating.standby_lost(self.job, member, "its connection closed", now)
        if self.job.phase == RUN and state.exit_code is None:
            return seating.lose(
                self.job,
                member,
                "its connection closed without an exit report (container "
                "killed, node crashed or rebooted)",
                now,
            )
        return []

    def tick(self, now: float) -> list[Action]:
        """The clock: join timeout, silent members, failures to judge, hangs, slow nodes."""
        if (
            self.job.phase == JOIN
            and now > self.job.join_deadline
            and seating.late_go_allowed(self.job)
        ):
            missing = sorted(self.job.awaited - self.job.members.keys())
            self.job.awaited -= set(missing)
            return [
                Log(
                    "warning",
                    f"{self._list(missing)} did not join within "
                    f"{now - self.job.join_started:.0f} s: going on without them",
                ),
                *seating.maybe_go(self.job, now),
            ]
        if self.job.phase == JOIN and now > self.job.join_deadline:
            missing = [m for m in sorted(self.job.awaited) if m not in self.job.members]
            waited = now - self.job.join_started
            reason = (
                f"{self._list(missing)} did not join within {waited:.0f} s "
                f"(ENTRYPOINT_JOIN_TIMEOUT={self.job.limits.join_timeout:g}); node 0 listens at "
                f"{self.job.address}. Check that they started, that their MASTER_ADDR is node "
                "0's address, and that the port is open between nodes"
            )
            return end(self.job, EXIT_PEERS, reason)
        actions: list[Action] = []
        if self.job.phase == RUN and self.job.decide_at is not None and now >= self.job.decide_at:
            return judge(self.job, now)
        if self.job.phase == RUN:
            for member, state in sorted(self.job.members.items()):
                silent = now - state.last_seen
                if state.exit_code is None and silent > self.job.limits.heartbeat_timeout:
                    why = (
                        f"silent for {silent:.0f} s (no heartbeat within "
                        f"ENTRYPOINT_HEARTBEAT_TIMEOUT={self.job.limits.heartbeat_timeout:g} s): "
                        "it hangs, is paused or is cut off from the network"
                    )
                    if not self.job.roster.elastic:
                        return seating.lose(self.job, member, why, now)
                    # The job goes on without it: what it reads if it ever runs again.
                    bye = Stop(EXIT_PEERS, f"node 0 dropped this {self.job.unit}, {why}")
                    lose = seating.lose if member in self.job.seats else seating.standby_lost
                    return [Send(member, bye), Close(member), *lose(self.job, member, why, now)]
            self.job.progress.tick(now, self.job.limits.heartbeat_interval)
            actions += hangs.check(self.job, now)
            if self.job.phase != RUN:
                return actions
            if now - self.job.last_slow_check >= STATS_EVERY:
                self.job.last_slow_check = now
                actions += self._check_slow()
                actions += self._check_slow_ranks(now)
            interval = self.job.limits.monitor_interval
            if interval > 0 and now - self.job.last_monitor >= interval:
                self.job.last_monitor = now
                actions.append(Log("info", monitor_table(self.job.members, now)))
        return actions

    def _check_slow(self) -> list[Action]:
        """Nodes whose GPUs lag the job's, named once, and once caught up (slow_nodes)."""
        window, seated = self.job.limits.slow_window, not self.job.roster.elastic
        training = {
            m: s.history for m, s in self.job.members.items() if seated or m in self.job.seats
        }
        slow = slow_nodes(training, max(1, round(window / STATS_EVERY)))
        said = news(self.job.slow, slow, training, window)
        self.job.slow = slow
        return [Log(level, f"{self.name(m)} {text}") for level, m, text in said]

    def _list(self, members: list[int]) -> str:
        if len(members) == 1:
            return f"{self.job.unit} {members[0]}"
        shown = ", ".join(str(m) for m in members[:10]) + (" ..." if len(members) > 10 else "")
        return f"{len(members)} {self.job.units} ({shown})"
