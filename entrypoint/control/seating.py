"""Node 0's start of each generation: wait for the members the start needs, compare them, seat
them, say `go`; and what a lost node means for the next start.

The `Conductor` (entrypoint.control.conductor) holds a `Seating` and the `JobState` they share.
Without spares or shrinking every member trains in its own node rank and a lost node ends the job
(or, with ENTRYPOINT_MAX_RESTARTS, waits for the platform to start it again). With them
(entrypoint.control.roster):
- spares: the last ENTRYPOINT_SPARES members stand by: they join, are compared like the others,
  beat, and start no trainer. A lost node's seat goes to a standby and every node's trainer
  starts again (from its checkpoint); a lost standby is logged and the job goes on;
- shrink: with no standby left and at least ENTRYPOINT_MIN_NODES nodes alive, the job starts
  again on the survivors, renumbered; below that it ends, naming the node;
- grow back: a node that joins the running job (its platform replaced a lost pod) is compared
  with node 0 and stands by; a job running below its size takes it in at the next restart.
Node 0 serves the channel and the rendezvous: losing it ends the job, on every node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from entrypoint.control.conductor_terms import (
    ALL,
    END,
    JOIN,
    RUN,
    STOPPING,
    Action,
    Close,
    JobState,
    Log,
    MemberState,
    Send,
)
from entrypoint.control.fingerprint import (
    Member,
    clock_problems,
    data_mismatches,
    layout_mismatches,
    mismatches,
)
from entrypoint.control.messages import Go, Health, Hello, Restart, Stop
from entrypoint.control.roster import changes, seat
from entrypoint.plan.errors import EXIT_CONFIG, EXIT_PEERS


class Seating:
    """Each start of the job, for node 0's Conductor: who joins, whether they match, their
    seats and `go`; spares, shrinking and growing back. It holds the Conductor's `JobState`,
    and ends the job or names a failure through the Conductor's own `end` and `failure`."""

    def __init__(
        self,
        job: JobState,
        *,
        end: Callable[..., list[Action]],
        failure: Callable[[int, dict | None, str, int, float], list[Action]],
        hello: Callable[[int, Hello, float, float], list[Action]],
    ) -> None:
        self.job = job
        self.end = end  # (code, reason, summary="", sig=None): stop every node
        self.failure = failure  # (member, failure, reason, code, now): a member failed
        self.hello = hello  # the Conductor's hello, for a member that joins again

    def maybe_go(self, now: float) -> list[Action]:
        if self.job.phase != JOIN or not self.job.awaited <= self.job.members.keys():
            return []
        if self.job.roster.elastic and self.job.generation == 0:
            return self._refuse_odd_standbys() + self._go(now)
        return self._go(now)

    def _go(self, now: float) -> list[Action]:
        """Every member the start waits for is here: compare them, seat them, say go."""
        members = [
            Member(m, s.host, s.fingerprint, s.clock_offset)
            for m, s in sorted(self.job.members.items())
        ]
        problems = layout_mismatches(members) + mismatches(members) + data_mismatches(members)
        # Clocks are compared once per job: drift during a long job must not turn a restart
        # into a configuration error.
        refusals, warnings = (
            clock_problems(members, self.job.limits.max_clock_skew)
            if self.job.generation == 0
            else ([], [])
        )
        if problems or refusals:
            return self.end(
                EXIT_CONFIG,
                "the nodes do not match, nothing was started: "
                + " | ".join(problems + refusals)
                + ". Run every node from the same image (tag and digest) with the "
                "same data, and synchronized clocks",
            )
        seats = self._seating()
        if len(seats) < self.job.roster.min_nodes or (
            self.job.generation == 0 and not self._full(seats)
        ):
            return self._too_few(seats)
        self.job.phase = RUN
        if self.job.training_since is None:
            self.job.training_since = now
        for state in self.job.members.values():
            state.last_seen, state.exit_code = now, None
        took = now - self.job.join_started
        first = members[0].fingerprint
        actions: list[Action] = [Log("warning", w) for w in warnings]
        if self.job.expected > 1:
            lock = str(first.get("image_lock"))
            lock = lock if lock.startswith("none") else lock[:12]
            actions.append(
                Log(
                    "info",
                    f"all {len(self.job.members)} {self.job.units} joined in {took:.1f} s "
                    f"and match: lock {lock}, "
                    f"torch {first.get('torch')}, jax {first.get('jax')}, "
                    f"deepspeed {first.get('deepspeed')}, NCCL "
                    f"{first.get('nccl')}",
                )
            )
        if not self.job.roster.elastic:
            return [*actions, Send(ALL, Go(self.job.generation, tuple(warnings)))]
        actions += [Log("info", line) for line in self._seating_news(seats)]
        self.job.seats = seats
        return actions + [
            Send(m, Go(self.job.generation, tuple(warnings), seats.get(m), len(seats)))
            for m in sorted(self.job.members)
        ]

    def lose(self, member: int, why: str, now: float) -> list[Action]:
        reason = f"lost {self.job.name(member)}: {why}"
        self.job.lost[member] = why
        if self.job.roster.elastic and not any(s in STOPPING for s in self.job.received):
            alive = [m for m, s in self.job.members.items() if s.connected and m != member]
            if len(seat(self.job.roster, self.job.seats, alive)) >= self.job.roster.min_nodes:
                return self._restart(reason, alive, now)
            return self.end(EXIT_PEERS, f"{reason}; {self._why_not_on(alive)}")
        return self.failure(member, None, reason, EXIT_PEERS, now)

    def next_start(self, awaited: Iterable[int], now: float) -> None:
        self.job.generation += 1
        self.job.received = {}
        self.job.failures, self.job.decide_at = {}, None
        self.job.phase = JOIN
        self.job.members.clear()  # every node says hello again before the restart goes ahead
        self.job.progress.restart()
        self.job.probe = None
        self.job.awaited = set(awaited)
        self.job.join_started = now
        self.job.join_deadline = self.job.join_started + self.job.limits.join_timeout

    # -- spares and shrinking (entrypoint.control.roster) -----------------------------------

    def _restart(self, reason: str, alive: list[int], now: float) -> list[Action]:
        """A node lost with a standby to take its seat, or enough nodes left to shrink: every
        node's trainer starts again, seated anew at the next `go`."""
        self.next_start(alive, now)
        return [
            Log("warning", f"{reason}; restarting every {self.job.unit}'s trainer without it"),
            Send(ALL, Restart(self.job.generation, reason)),
        ]

    def _seating(self) -> dict[int, int]:
        if not self.job.roster.elastic:
            return self.job.seats
        return seat(self.job.roster, self.job.seats, self.job.members.keys(), self._domains())

    def _domains(self) -> dict[int, str]:
        """Each member's NVLink domain, as it last said (a lost member's included)."""
        return {m: s.domain for m, s in dict(self.job.seen).items() if s.domain}

    def _full(self, seats: dict[int, int]) -> bool:
        return len(seats) >= self.job.roster.full

    def late_go_allowed(self) -> bool:
        """Elastic jobs go on without members that do not come: spares at the start, lost
        nodes at a restart, as long as enough seats are filled."""
        if not self.job.roster.elastic or 0 not in self.job.members:
            return False
        seats = seat(self.job.roster, self.job.seats, self.job.members.keys())
        return (
            self._full(seats)
            if self.job.generation == 0
            else len(seats) >= self.job.roster.min_nodes
        )

    def _why_not_on(self, alive: list[int]) -> str:
        r = self.job.roster
        if r.min_nodes < r.full:
            return (
                f"{len(alive)} {self.job.units} left, fewer than ENTRYPOINT_MIN_NODES={r.min_nodes}"
            )
        return (
            f"no standby left to take its place (ENTRYPOINT_SPARES={r.spares}); set "
            f"ENTRYPOINT_MIN_NODES below {r.full} to go on with fewer {self.job.units}"
        )

    def _too_few(self, seats: dict[int, int]) -> list[Action]:
        alive = sorted(self.job.members)
        need = self.job.roster.full if self.job.generation == 0 else self.job.roster.min_nodes
        return self.end(
            EXIT_PEERS,
            f"only {len(seats)} {self.job.units} can train, the job needs {need}: "
            + self._why_not_on(alive),
        )

    def _seating_news(self, seats: dict[int, int]) -> list[str]:
        standby = sorted(m for m in self.job.members if m not in seats)
        left = f"{len(standby)} standby ({', '.join(map(str, standby)) or 'none'})"
        size = f"training on {len(seats)} of {self.job.roster.full} {self.job.units}"
        if self.job.generation == 0:
            return [f"{size}; {left}"]
        return [
            f"restart {self.job.generation}: "
            + "; ".join([*changes(self.job.seats, seats), size, left])
        ]

    def hello_while_running(
        self, member: int, message: Hello, now: float, wall_now: float
    ) -> list[Action]:
        """A spare late for the start, or a lost node its platform replaced, stands by; a
        seated node that says hello again was restarted by its platform: the job restarts."""
        if member not in self.job.members:
            return self._standby_joins(member, message, now, wall_now)
        actions = self._restart(
            f"{self.job.name(member)} started again while the job was running (its container "
            "or pod was restarted)",
            [m for m, s in self.job.members.items() if s.connected],
            now,
        )
        return actions + self.hello(member, message, now, wall_now)

    def _standby_joins(
        self, member: int, message: Hello, now: float, wall_now: float
    ) -> list[Action]:
        """A node that joins the running job stands by, once it matches node 0."""
        state = MemberState(
            host=message.host,
            joined_at=now,
            last_seen=now,
            fingerprint=dict(message.fingerprint),
            clock_offset=message.time - wall_now,
            domain=message.domain,
        )
        refusal = self._unlike_node0(member, state)
        if refusal:
            return refusal
        self.job.members[member] = state
        waiting = len([m for m in self.job.members if m not in self.job.seats])
        later = (
            f"; it takes a seat at the next restart (training on {len(self.job.seats)} of "
            f"{self.job.roster.full})"
            if not self._full(self.job.seats)
            else ""
        )
        return [
            Log("info", f"{self.job.name(member)} joined as a standby; {waiting} standby{later}"),
            Send(member, Go(self.job.generation, (), None, len(self.job.seats))),
        ]

    def _unlike_node0(self, member: int, state: MemberState) -> list[Action]:
        """A standby that does not match node 0 is refused (its actions), the job goes on."""
        ref = self.job.members.get(0)
        pair = [
            Member(m, s.host, s.fingerprint, s.clock_offset)
            for m, s in ((0, ref), (member, state))
            if s is not None
        ]
        problems = layout_mismatches(pair) + mismatches(pair) + data_mismatches(pair)
        if not problems:
            return []
        reason = (
            f"{self.job.unit} {member} ({state.host}) does not match node 0 and cannot stand by: "
            f"{' | '.join(problems)}. Run every node from the same image (tag and digest)"
        )
        return [
            Log("warning", f"refused {reason}"),
            Send(member, Stop(EXIT_CONFIG, reason)),
            Close(member),
        ]

    def _refuse_odd_standbys(self) -> list[Action]:
        """At the first start, each spare is compared with node 0 alone: one that differs is
        refused now, not when it is needed, and the job starts without it."""
        actions: list[Action] = []
        for member in sorted(m for m in self.job.members if m not in self.job.seats):
            refusal = self._unlike_node0(member, self.job.members[member])
            if refusal:
                del self.job.members[member]
                self.job.awaited.discard(member)
                actions += refusal
        return actions

    def health(self, member: int, message: Health, now: float) -> list[Action]:
        """A GPU or link event on a node: counted; a fatal one takes the node out of the job at
        once, without waiting for its trainer to fail or hang."""
        state = self.job.members.get(member)
        if state is None or self.job.phase == END:
            return []
        key = (member, message.event)
        first = key not in self.job.health_events
        self.job.health_events[key] = self.job.health_events.get(key, 0) + 1
        if not message.fatal:
            text = f"{self.job.name(member)}: {message.text} (counted in /metrics; the job goes on)"
            return [Log("warning", text)] if first else []
        return self.unhealthy(member, state.host, message.text, now)

    def unhealthy(self, member: int, host: str, why: str, now: float) -> list[Action]:
        """`member` failed a check before its start, or a fatal event struck it: a standby
        takes its seat (or the job shrinks) where the roster allows; else the job stops,
        naming it. Node 0 serves the job: its own sickness ends the job."""
        self.job.sick[member] = why
        if member not in self.job.seen:  # for /metrics: a node that never joined, by its host
            self.job.seen[member] = MemberState(host=host, connected=False, joined_at=now)
        name = f"{self.job.unit} {member} ({host})"
        bye = Stop(EXIT_PEERS, f"node 0 took this {self.job.unit} out of the job: {why}")
        if self.job.phase == END:
            return [Send(member, bye), Close(member)]
        if not self.job.roster.elastic or member == 0:
            self.job.lost[member] = why
            spares = ", or give the job spares (ENTRYPOINT_SPARES) so a standby takes its place"
            spares = "" if self.job.roster.elastic else spares
            return self.end(
                EXIT_PEERS, f"{name}: {why}; drain it and start the job on healthy nodes{spares}"
            )
        if self.job.phase == RUN and member not in self.job.members:  # a replaced node, sick
            self.job.lost[member] = why
            return [
                Log("warning", f"{name}: {why}; it cannot stand by"),
                Send(member, bye),
                Close(member),
            ]
        if self.job.phase == JOIN:
            self.job.members.pop(member, None)
            self.job.awaited.discard(member)
            self.job.lost[member] = why
            return [
                Log("warning", f"{name}: {why}; it stands aside and the job starts without it"),
                Send(member, bye),
                Close(member),
                *self.maybe_go(now),
            ]
        lose = self.lose if member in self.job.seats else self.standby_lost
        return [Send(member, bye), Close(member), *lose(member, why, now)]

    def not_planned(self, member: int, host: str) -> list[Action]:
        """A member beyond the node count node 0 plans: refused; at the join, the job ends."""
        reason = (
            f"{self.job.unit} {member} ({host}) joined, but node 0 plans {self.job.expected} "
            f"{self.job.units} (0-{self.job.expected - 1}): every node needs the same node "
            "count; check NNODES/WORLD_SIZE on each"
        )
        if self.job.phase == JOIN:  # a node of this job that disagrees: nothing may start
            return [
                Send(member, Stop(EXIT_CONFIG, reason)),
                Close(member),
                *self.end(EXIT_CONFIG, reason),
            ]
        return [Send(member, Stop(EXIT_CONFIG, reason)), Close(member)]

    def lost_in_restart(self, member: int, now: float) -> list[Action]:
        """A member's connection closed while the job restarts: the others go on without it."""
        if member not in self.job.awaited and member not in self.job.members:
            return []
        self.job.members.pop(member, None)
        self.job.awaited.discard(member)
        self.job.lost[member] = "its connection closed during a restart"
        return [
            Log("warning", f"lost {self.job.unit} {member} during the restart"),
            *self.maybe_go(now),
        ]

    def standby_lost(self, member: int, why: str, now: float) -> list[Action]:
        state = self.job.members.pop(member)
        self.job.lost[member] = why
        waiting = len([m for m in self.job.members if m not in self.job.seats])
        return [
            Log(
                "warning",
                f"lost standby {self.job.unit} {member} ({state.host}): {why}; {waiting} standby "
                "left, training goes on",
            )
        ]
