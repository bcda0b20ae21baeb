"""Node 0's start of each generation: wait for the members the start needs, compare them, seat
them, say `go`; and what a lost node means for the next start.

Functions of the job's state (entrypoint.coordinator.state), called by the Conductor's events
(entrypoint.coordinator.conductor); they end the job or name a failure through its verdicts
(entrypoint.coordinator.verdicts). Without spares or shrinking every member trains in its own node
rank and a lost node ends the job (or, with ENTRYPOINT_MAX_RESTARTS, waits for the platform to
start it again). With them
(entrypoint.coordinator.roster):
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

from entrypoint import STOPPING
from entrypoint.control.actions import ALL, Action, Close, Log, Send
from entrypoint.control.messages import Go, Health, Hello, Stop
from entrypoint.coordinator.comparison import (
    Member,
    clock_problems,
    data_mismatches,
    layout_mismatches,
    mismatches,
)
from entrypoint.coordinator.roster import changes, seat
from entrypoint.coordinator.state import END, JOIN, RUN, JobState, MemberState
from entrypoint.coordinator.verdicts import end, failure, restart
from entrypoint.plan.errors import EXIT_CONFIG, EXIT_PEERS


def maybe_go(job: JobState, now: float) -> list[Action]:
    if job.phase != JOIN or not job.awaited <= job.members.keys():
        return []
    if job.roster.elastic and job.generation == 0:
        return _refuse_odd_standbys(job) + _go(job, now)
    return _go(job, now)


def _go(job: JobState, now: float) -> list[Action]:
    """Every member the start waits for is here: compare them, seat them, say go."""
    members = [
        Member(m, s.host, s.fingerprint, s.clock_offset) for m, s in sorted(job.members.items())
    ]
    problems = layout_mismatches(members, job.head) + mismatches(members) + data_mismatches(members)
    # Clocks are compared once per job: drift during a long job must not turn a restart
    # into a configuration error.
    refusals, warnings = (
        clock_problems(members, job.limits.max_clock_skew) if job.generation == 0 else ([], [])
    )
    if problems or refusals:
        return end(
            job,
            EXIT_CONFIG,
            "the nodes do not match, nothing was started: "
            + " | ".join(problems + refusals)
            + ". Run every node from the same image (tag and digest) with the "
            "same data, and synchronized clocks",
        )
    seats = _seating(job)
    if len(seats) < job.roster.min_nodes or (job.generation == 0 and not _full(job, seats)):
        return _too_few(job, seats)
    job.phase = RUN
    job.went = now
    if job.training_since is None:
        job.training_since = now
    for state in job.members.values():
        state.last_seen, state.exit_code = now, None
    took = now - job.join_started
    first = members[0].fingerprint
    actions: list[Action] = [Log("warning", w) for w in warnings]
    if job.expected > 1:
        lock = first.image_lock
        lock = lock if lock.startswith("none") else lock[:12]
        actions.append(
            Log(
                "info",
                f"all {len(job.members)} {job.units} joined in {took:.1f} s "
                f"and match: lock {lock}, "
                f"torch {first.torch}, jax {first.jax}, "
                f"deepspeed {first.deepspeed}, NCCL {first.nccl}",
            )
        )
    if not job.roster.elastic:
        return [*actions, Send(ALL, Go(job.generation, tuple(warnings)))]
    actions += [Log("info", line) for line in _seating_news(job, seats)]
    actions += _choose_etcd(job)
    job.seats = seats
    return actions + [
        Send(m, Go(job.generation, tuple(warnings), seats.get(m), len(seats), job.etcd))
        for m in sorted(job.members)
    ]


def _choose_etcd(job: JobState) -> list[Action]:
    """At the first `go` of a job that carries its own etcd: its members, the first of the
    members joined (node 0 among them), fixed from then on."""
    if not job.etcd_members or job.etcd:
        return []
    chosen = sorted(job.members)[: job.etcd_members]
    if len(chosen) < 3:
        return [
            Log(
                "warning",
                f"the job's etcd needs 3 {job.units}, {len(chosen)} joined: "
                "losing node 0 ends this job",
            )
        ]
    job.etcd = tuple(f"{m}={job.members[m].host}" for m in chosen)
    return [
        Log(
            "info",
            f"the job's etcd runs on {len(chosen)} {job.units}: "
            + ", ".join(job.name(m) for m in chosen),
        )
    ]


def lose(job: JobState, member: int, why: str, now: float) -> list[Action]:
    reason = f"lost {job.name(member)}: {why}"
    job.lost[member] = why
    if job.roster.elastic and not any(s in STOPPING for s in job.received):
        alive = [m for m, s in job.members.items() if s.connected and m != member]
        if len(seat(job.roster, job.seats, alive, head=job.head)) >= job.roster.min_nodes:
            return restart(job, reason, alive, now)
        return end(job, EXIT_PEERS, f"{reason}; {_why_not_on(job, alive)}")
    return failure(job, member, None, reason, EXIT_PEERS, now)


# -- spares and shrinking (entrypoint.coordinator.roster) -----------------------------------


def _seating(job: JobState) -> dict[int, int]:
    if not job.roster.elastic:
        return job.seats
    return seat(job.roster, job.seats, job.members.keys(), _domains(job), job.head)


def _domains(job: JobState) -> dict[int, str]:
    """Each member's NVLink domain, as it last said (a lost member's included)."""
    return {m: s.domain for m, s in dict(job.seen).items() if s.domain}


def _full(job: JobState, seats: dict[int, int]) -> bool:
    return len(seats) >= job.roster.full


def late_go_allowed(job: JobState) -> bool:
    """Elastic jobs go on without members that do not come: spares at the start, lost
    nodes at a restart, as long as enough seats are filled."""
    if not job.roster.elastic or job.head not in job.members:
        return False
    seats = seat(job.roster, job.seats, job.members.keys(), head=job.head)
    return _full(job, seats) if job.generation == 0 else len(seats) >= job.roster.min_nodes


def _why_not_on(job: JobState, alive: list[int]) -> str:
    r = job.roster
    if r.min_nodes < r.full:
        return f"{len(alive)} {job.units} left, fewer than ENTRYPOINT_MIN_NODES={r.min_nodes}"
    return (
        f"no standby left to take its place (ENTRYPOINT_SPARES={r.spares}); set "
        f"ENTRYPOINT_MIN_NODES below {r.full} to go on with fewer {job.units}"
    )


def _too_few(job: JobState, seats: dict[int, int]) -> list[Action]:
    alive = sorted(job.members)
    need = job.roster.full if job.generation == 0 else job.roster.min_nodes
    return end(
        job,
        EXIT_PEERS,
        f"only {len(seats)} {job.units} can train, the job needs {need}: "
        + _why_not_on(job, alive),
    )


def _seating_news(job: JobState, seats: dict[int, int]) -> list[str]:
    standby = sorted(m for m in job.members if m not in seats)
    left = f"{len(standby)} standby ({', '.join(map(str, standby)) or 'none'})"
    size = f"training on {len(seats)} of {job.roster.full} {job.units}"
    if job.generation == 0:
        return [f"{size}; {left}"]
    return [f"restart {job.generation}: " + "; ".join([*changes(job.seats, seats), size, left])]


def rejoined(job: JobState, member: int) -> bool:
    """While an elastic job runs: whether `member`, which says hello, is a seated node its
    platform restarted (the job restarts, and it joins the next start) rather than a spare
    late for the start or a lost node's replacement (`standby_joins`)."""
    return member in job.members


def restart_for(job: JobState, member: int, now: float) -> list[Action]:
    """A seated node said hello again: its platform restarted it, and every node's trainer
    starts again; its hello then counts for the next start."""
    return restart(
        job,
        f"{job.name(member)} started again while the job was running (its container "
        "or pod was restarted)",
        [m for m, s in job.members.items() if s.connected],
        now,
    )


def standby_joins(
    job: JobState, member: int, message: Hello, now: float, wall_now: float
) -> list[Action]:
    """A node that joins the running job stands by, once it matches node 0."""
    state = MemberState(
        host=message.host,
        joined_at=now,
        last_seen=now,
        fingerprint=message.fingerprint,
        clock_offset=message.time - wall_now,
        domain=message.domain,
    )
    refusal = _unlike_node0(job, member, state)
    if refusal:
        return refusal
    job.members[member] = state
    waiting = len([m for m in job.members if m not in job.seats])
    later = (
        f"; it takes a seat at the next restart (training on {len(job.seats)} of {job.roster.full})"
        if not _full(job, job.seats)
        else ""
    )
    return [
        Log("info", f"{job.name(member)} joined as a standby; {waiting} standby{later}"),
        Send(member, Go(job.generation, (), None, len(job.seats), job.etcd)),
    ]


def _unlike_node0(job: JobState, member: int, state: MemberState) -> list[Action]:
    """A standby that does not match node 0 is refused (its actions), the job goes on."""
    ref = job.members.get(job.head)
    pair = [
        Member(m, s.host, s.fingerprint, s.clock_offset)
        for m, s in ((job.head, ref), (member, state))
        if s is not None
    ]
    problems = layout_mismatches(pair, job.head) + mismatches(pair) + data_mismatches(pair)
    if not problems:
        return []
    reason = (
        f"{job.unit} {member} ({state.host}) does not match node 0 and cannot stand by: "
        f"{' | '.join(problems)}. Run every node from the same image (tag and digest)"
    )
    return [
        Log("warning", f"refused {reason}"),
        Send(member, Stop(EXIT_CONFIG, reason)),
        Close(member),
    ]


def _refuse_odd_standbys(job: JobState) -> list[Action]:
    """At the first start, each spare is compared with node 0 alone: one that differs is
    refused now, not when it is needed, and the job starts without it."""
    actions: list[Action] = []
    for member in sorted(m for m in job.members if m not in job.seats):
        refusal = _unlike_node0(job, member, job.members[member])
        if refusal:
            del job.members[member]
            job.awaited.discard(member)
            actions += refusal
    return actions


def health(job: JobState, member: int, message: Health, now: float) -> list[Action]:
    """A GPU or link event on a node: counted; a fatal one takes the node out of the job at
    once, without waiting for its trainer to fail or hang."""
    state = job.members.get(member)
    if state is None or job.phase == END:
        return []
    key = (member, message.event)
    first = key not in job.health_events
    job.health_events[key] = job.health_events.get(key, 0) + 1
    if not message.fatal:
        text = f"{job.name(member)}: {message.text} (counted in /metrics; the job goes on)"
        return [Log("warning", text)] if first else []
    return unhealthy(job, member, state.host, message.text, now)


def unhealthy(job: JobState, member: int, host: str, why: str, now: float) -> list[Action]:
    """`member` failed a check before its start, or a fatal event struck it: a standby
    takes its seat (or the job shrinks) where the roster allows; else the job stops,
    naming it. Node 0 serves the job: its own sickness ends the job."""
    job.sick[member] = why
    if member not in job.seen:  # for /metrics: a node that never joined, by its host
        job.seen[member] = MemberState(host=host, connected=False, joined_at=now)
    name = f"{job.unit} {member} ({host})"
    bye = Stop(EXIT_PEERS, f"node 0 took this {job.unit} out of the job: {why}")
    if job.phase == END:
        return [Send(member, bye), Close(member)]
    if not job.roster.elastic or member == 0:
        job.lost[member] = why
        spares = ", or give the job spares (ENTRYPOINT_SPARES) so a standby takes its place"
        spares = "" if job.roster.elastic else spares
        return end(
            job, EXIT_PEERS, f"{name}: {why}; drain it and start the job on healthy nodes{spares}"
        )
    if job.phase == RUN and member not in job.members:  # a replaced node, sick
        job.lost[member] = why
        return [
            Log("warning", f"{name}: {why}; it cannot stand by"),
            Send(member, bye),
            Close(member),
        ]
    if job.phase == JOIN:
        job.members.pop(member, None)
        job.awaited.discard(member)
        job.lost[member] = why
        return [
            Log("warning", f"{name}: {why}; it stands aside and the job starts without it"),
            Send(member, bye),
            Close(member),
            *maybe_go(job, now),
        ]
    gone = lose if member in job.seats else standby_lost
    return [Send(member, bye), Close(member), *gone(job, member, why, now)]


def not_planned(job: JobState, member: int, host: str) -> list[Action]:
    """A member beyond the node count node 0 plans: refused; at the join, the job ends."""
    reason = (
        f"{job.unit} {member} ({host}) joined, but node 0 plans {job.expected} "
        f"{job.units} (0-{job.expected - 1}): every node needs the same node "
        "count; check NNODES/WORLD_SIZE on each"
    )
    if job.phase == JOIN:  # a node of this job that disagrees: nothing may start
        return [
            Send(member, Stop(EXIT_CONFIG, reason)),
            Close(member),
            *end(job, EXIT_CONFIG, reason),
        ]
    return [Send(member, Stop(EXIT_CONFIG, reason)), Close(member)]


def lost_in_restart(job: JobState, member: int, now: float) -> list[Action]:
    """A member's connection closed while the job restarts: the others go on without it."""
    if member not in job.awaited and member not in job.members:
        return []
    job.members.pop(member, None)
    job.awaited.discard(member)
    job.lost[member] = "its connection closed during a restart"
    return [
        Log("warning", f"lost {job.unit} {member} during the restart"),
        *maybe_go(job, now),
    ]


def standby_lost(job: JobState, member: int, why: str, now: float) -> list[Action]:
    state = job.members.pop(member)
    job.lost[member] = why
    waiting = len([m for m in job.members if m not in job.seats])
    return [
        Log(
            "warning",
            f"lost standby {job.unit} {member} ({state.host}): {why}; {waiting} standby "
            "left, training goes on",
        )
    ]
