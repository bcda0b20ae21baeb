"""Node 0's view of the job, as a pure state machine: events in, actions out.

The actions, phases and limits it shares with its caller are in entrypoint.control.conductor_terms.

The entrypoints of all nodes talk over their own small channel (entrypoint.control.transport), which
does not depend on NCCL, gloo or the trainer. Node 0 runs the Conductor; it decides:

- join: every node says hello with its fingerprint; when all have come, they are compared
  (entrypoint.control.fingerprint) and every node gets `go`, or `stop` with the reason. Nodes that
  never come stop the others after ENTRYPOINT_JOIN_TIMEOUT.
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

from entrypoint.control.conductor_terms import (
    ALL,
    END,
    JOIN,
    RUN,
    STOPPING,
    Action,
    Close,
    JobState,
    Limits,
    Log,
    MemberState,
    Send,
    StackProbe,
    failure_summary,
    monitor_table,
    signal_name,
)
from entrypoint.control.messages import (
    Beat,
    Done,
    Dump,
    Exit,
    Health,
    Hello,
    Restart,
    Signal,
    Stacks,
    Stop,
)
from entrypoint.control.progress import (
    STACKS_WAIT,
    HangRule,
    RankReport,
    hang_reason,
    hang_rule,
    hang_setting_warning,
    ranks_text,
    slow_rank_news,
    slow_ranks,
)
from entrypoint.control.roster import Roster
from entrypoint.control.seating import Seating
from entrypoint.control.slow_nodes import STATS_EVERY, news, slow_nodes
from entrypoint.plan.errors import EXIT_CONFIG, EXIT_HUNG, EXIT_PEERS


class Conductor:
    """Node 0's decisions for the job: a method per event (a hello, a beat, an exit, a signal,
    the ranks' stacks, a GPU's health, a closed connection, the clock's tick), each taking `now`
    and returning the actions its caller (entrypoint.control.control_server) carries out. The
    job's state is `job`; each start's join is `seating`'s.

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
    ) -> None:
        self.job = JobState(
            expected, limits, roster or Roster(expected, expected, expected), now, unit, address
        )
        self.seating = Seating(self.job, end=self._end, failure=self._failure, hello=self.hello)
        self._last_monitor = now
        self._last_slow_check = now

    # -- names -----------------------------------------------------------------------------

    def name(self, member: int) -> str:
        return self.job.name(member)

    def health(self, member: int, message: Health, now: float) -> list[Action]:
        """A GPU or link event on a node: counted; a fatal one takes the node out of the job."""
        return self.seating.health(member, message, now)

    # -- events ----------------------------------------------------------------------------

    def hello(self, member: int, message: Hello, now: float, wall_now: float) -> list[Action]:
        """A node of this job (the handshake passed) says hello: join, or join again."""
        host = message.host
        if not 0 <= member < self.job.expected:
            return self.seating.not_planned(member, host)
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
            return self._end(EXIT_CONFIG, reason)
        if message.unhealthy:
            return self.seating.unhealthy(member, host, message.unhealthy, now)
        self.job.sick.pop(member, None)  # a node back healthy (serviced, or a passing problem)
        if self.job.phase == RUN and self.job.roster.elastic:
            return self.seating.hello_while_running(member, message, now, wall_now)
        if self.job.phase == RUN:
            # A node that comes back while the job runs was restarted by its platform: the job it
            # belonged to is gone on that node. With restarts left, the newcomer is the first
            # member of the next start, whatever became of its old connection.
            actions = self._failure(
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
            return [Send(member, self._stop_message(code, reason)), Close(member)]
        self.job.members[member] = self.job.seen[member] = MemberState(
            host=host,
            joined_at=now,
            last_seen=now,
            fingerprint=dict(message.fingerprint),
            clock_offset=message.time - wall_now,
            domain=message.domain,
        )
        self.job.lost.pop(member, None)
        return self.seating.maybe_go(now)

    def beat(self, member: int, message: Beat, now: float) -> list[Action]:
        """A member is alive: its GPUs' figures and its ranks' steps (hangs are judged here)."""
        state = self.job.members.get(member)
        if state is not None:
            state.last_seen = now
            if message.stats:
                state.stats = dict(message.stats)
                state.history.append(state.stats.get("gpus") or [])
            if message.ranks is not None and self.job.phase == RUN and member in self.job.seats:
                reports = message.reports()
                self.job.progress.beat(member, reports, now)
                return self._check_hang_setting(reports)
        return []

    def _check_hang_setting(self, reports: list[RankReport]) -> list[Action]:
        warned = self.job.hang_setting_warned
        said = None if warned else hang_setting_warning(self.job.limits.hang_timeout, reports)
        self.job.hang_setting_warned = warned or said is not None
        return [Log("warning", said)] if said else []

    def hang_rule(self) -> HangRule:
        """The hang timeout in force: ENTRYPOINT_HANG_TIMEOUT, or learned from the steps."""
        p, lim = self.job.progress, self.job.limits
        args = (lim.hang_timeout, p.longest, p.warmed, lim.collective_timeout, p.group_timeout())
        return hang_rule(*args)

    def stacks(self, member: int, message: Stacks, now: float) -> list[Action]:
        """A node's ranks' stacks, asked for when no rank stepped: once every node training
        has answered (or STACKS_WAIT ran out), the hang is named and acted on."""
        state = self.job.members.get(member)
        if self.job.probe is None or self.job.phase != RUN or state is None:
            return []
        self.job.probe.answers[member] = message.stacks(member, state.host)
        return self._judge_hang(now) if self._all_answered() and not self.job.failures else []

    def _all_answered(self) -> bool:
        assert self.job.probe is not None
        training = {m for m, s in self.job.members.items() if s.connected and m in self.job.seats}
        return training <= self.job.probe.answers.keys()

    def _check_hang(self, now: float) -> list[Action]:
        if self.job.failures:  # a failure awaits its verdict: it, not a hang, is the cause
            self.job.probe = None
            return []
        if self.job.probe is not None:
            return self._judge_hang(now) if now >= self.job.probe.deadline else []
        rule = self.hang_rule()
        silent = self.job.progress.stalled(now, rule.seconds)
        if silent is None:
            return []
        self.job.probe = StackProbe(silent, rule, now + STACKS_WAIT)
        return [
            Log(
                "warning",
                f"no rank has stepped for {silent:.0f} s (hang timeout {rule.seconds:g} s, "
                f"{rule.source}): asking every {self.job.unit} for its ranks' stacks",
            ),
            Send(ALL, Dump(round(silent, 1))),
        ]

    def _judge_hang(self, now: float) -> list[Action]:
        probe, self.job.probe = self.job.probe, None
        assert probe is not None
        training = [m for m, s in self.job.members.items() if s.connected and m in self.job.seats]
        blamed, reason = hang_reason(
            probe.answers, probe.silent, probe.rule, {m: self.name(m) for m in self.job.members},
            [m for m in sorted(training) if m not in probe.answers],
        )  # fmt: skip
        member = blamed if blamed is not None else min(training, default=0)
        return self._failure(member, None, reason, EXIT_HUNG, now)

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
            return self.seating.standby_lost(member, f"it exited with code {code}", now)
        if sig and self.job.phase != END and 0 <= member < self.job.expected:
            who = self.name(self.job.received.get(sig, member))
            return self._end(
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
        self.job.failures[member] = (message, code, len(self.job.failures))
        if self.job.decide_at is None:
            self.job.decide_at = now + self.job.limits.failure_window
        everyone = all(
            s.exit_code is not None or not s.connected
            for m, s in self.job.members.items()
            if m in self.job.seats
        )
        return self._judge(now) if now >= self.job.decide_at or everyone else []

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
            return self._judge(now)
        reason = f"{self.name(member)} received {signal_name(sig)}"
        return [
            Log("warning", f"{reason}: passing it to every {self.job.unit}'s workers"),
            Send(ALL, Signal(sig, reason)),
        ]

    def closed(self, member: int, now: float) -> list[Action]:
        """A member's connection closed without its exit: it is lost (a standby: logged)."""
        state = self.job.members.get(member)
        if self.job.phase == JOIN and self.job.generation and self.job.roster.elastic:
            return self.seating.lost_in_restart(member, now)
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
            return self.seating.standby_lost(member, "its connection closed", now)
        if self.job.phase == RUN and state.exit_code is None:
            return self.seating.lose(
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
            and self.seating.late_go_allowed()
        ):
            missing = sorted(self.job.awaited - self.job.members.keys())
            self.job.awaited -= set(missing)
            return [
                Log(
                    "warning",
                    f"{self._list(missing)} did not join within "
                    f"{now - self.job.join_started:.0f} s: going on without them",
                ),
                *self.seating.maybe_go(now),
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
            return self._end(EXIT_PEERS, reason)
        actions: list[Action] = []
        if self.job.phase == RUN and self.job.decide_at is not None and now >= self.job.decide_at:
            return self._judge(now)
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
                        return self.seating.lose(member, why, now)
                    # The job goes on without it: what it reads if it ever runs again.
                    bye = Stop(EXIT_PEERS, f"node 0 dropped this {self.job.unit}, {why}")
                    lose = (
                        self.seating.lose if member in self.job.seats else self.seating.standby_lost
                    )
                    return [Send(member, bye), Close(member), *lose(member, why, now)]
            self.job.progress.tick(now, self.job.limits.heartbeat_interval)
            actions += self._check_hang(now)
            if self.job.phase != RUN:
                return actions
            if now - self._last_slow_check >= STATS_EVERY:
                self._last_slow_check = now
                actions += self._check_slow()
                actions += self._check_slow_ranks(now)
            interval = self.job.limits.monitor_interval
            if interval > 0 and now - self._last_monitor >= interval:
                self._last_monitor = now
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

    # -- decisions -------------------------------------------------------------------------

    def _judge(self, now: float) -> list[Action]:
        """The failure shown and acted on: a rank that only lost a peer after any other (clock
        offsets are estimates), then by its own time on node 0's clock, else the report's order."""

        def first(item: tuple[int, tuple[Exit, int, int]]) -> tuple[bool, float, int]:
            member, (message, _code, order) = item
            when = (failure := message.failure or {}).get("time")
            offset = self.job.members[member].clock_offset if member in self.job.members else 0.0
            at = float(when) - offset if when is not None else float("inf")
            return (bool(failure.get("peer_lost")), at, order)

        member, (message, code, _) = min(self.job.failures.items(), key=first)
        self.job.failures, self.job.decide_at = {}, None
        return self._failure(
            member,
            message.failure,
            message.reason or f"{self.name(member)}'s trainer exited with code {code}",
            code,
            now,
        )

    def _failure(
        self, member: int, failure: dict | None, reason: str, code: int, now: float
    ) -> list[Action]:
        summary = failure_summary(failure, self.name(member)) if failure else ""
        stopping = next((sig for sig in self.job.received if sig in STOPPING), None)
        if stopping is not None:
            # The job is being stopped (preemption, scancel): a failure on the way out is no
            # reason to start it again.
            who = self.name(self.job.received[stopping])
            return self._end(
                128 + stopping,
                f"{reason}; no restart: {who} received {signal_name(stopping)}",
                summary,
                sig=stopping,
            )
        if self.job.restarts_left > 0 and code != EXIT_CONFIG:
            self.job.restarts_left -= 1
            alive = [m for m, s in self.job.members.items() if s.connected]
            self.seating.next_start(
                alive if self.job.roster.elastic else range(self.job.expected), now
            )
            used = self.job.limits.max_restarts - self.job.restarts_left
            actions: list[Action] = [Log("error", summary)] if summary else []
            actions += [
                Log(
                    "warning",
                    f"{reason}; restarting every {self.job.unit}'s trainer "
                    f"(restart {used} of {self.job.limits.max_restarts})",
                ),
                Send(ALL, Restart(self.job.generation, reason)),
            ]
            return actions
        return self._end(code, reason, summary)

    def _end(
        self, code: int, reason: str, summary: str = "", sig: int | None = None
    ) -> list[Action]:
        self.job.phase, self.job.outcome = END, (code, reason)
        self.job.failures, self.job.decide_at = {}, None
        actions: list[Action] = [Log("error", summary)] if summary else []
        actions += [
            Log("error", f"stopping every {self.job.unit} (exit {code}): {reason}"),
            Send(ALL, self._stop_message(code, reason, sig)),
        ]
        return actions

    @staticmethod
    def _stop_message(code: int, reason: str, sig: int | None = None) -> Stop:
        """`sig`: the job stops because a node received it; the other nodes pass it to
        their workers. Without it, the workers get SIGTERM whatever the code."""
        return Stop(code, reason, sig or None)

    def _list(self, members: list[int]) -> str:
        if len(members) == 1:
            return f"{self.job.unit} {members[0]}"
        shown = ", ".join(str(m) for m in members[:10]) + (" ..." if len(members) > 10 else "")
        return f"{len(members)} {self.job.units} ({shown})"
