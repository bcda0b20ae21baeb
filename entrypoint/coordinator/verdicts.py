"""Node 0's verdicts over the job's state: the failure shown and acted on (`judge`, `failure`), a
restart of every node's trainer (`restart`), and the job's end (`end`). Pure functions of
`JobState` (entrypoint.coordinator.state): the caller passes `now`, and carries out the actions
returned."""

from __future__ import annotations

from collections.abc import Iterable

from entrypoint import STOPPING, signal_name
from entrypoint.control.actions import ALL, Action, Log, Send
from entrypoint.control.messages import Restart, Stop
from entrypoint.control.rank_records import Failure
from entrypoint.coordinator.state import END, JobState, Reported
from entrypoint.plan.errors import EXIT_CONFIG


def failure_summary(failed: Failure, where: str) -> str:
    """The failing rank's error, once: rank, node, exit code, the last lines of its traceback."""
    rank, local = failed.rank, failed.local_rank
    head = (
        (f"worker failed: rank {rank}" if rank is not None else "worker failed")
        + f" on {where}"
        + (f" (local rank {local})" if local is not None else "")
        + f", exit code {'?' if failed.exitcode is None else failed.exitcode}"
    )
    return head + ("\n    " + "\n    ".join(failed.tail) if failed.tail else "")


def judge(job: JobState, now: float) -> list[Action]:
    """The failure shown and acted on, of those reported: a rank that only lost a peer after
    any other (clock offsets are estimates), then by its own time on node 0's clock, else the
    report's order."""

    def first(item: tuple[int, Reported]) -> tuple[bool, float, int]:
        member, reported = item
        failed = reported.exit.failure or Failure()
        offset = job.members[member].clock_offset if member in job.members else 0.0
        at = failed.time - offset if failed.time is not None else float("inf")
        return (failed.peer_lost, at, reported.order)

    member, chosen = min(job.failures.items(), key=first)
    message, code = chosen.exit, chosen.code
    job.failures, job.decide_at = {}, None
    reason = message.reason or f"{job.name(member)}'s trainer exited with code {code}"
    return failure(job, member, message.failure, reason, code, now)


def failure(
    job: JobState, member: int, failed: Failure | None, reason: str, code: int, now: float
) -> list[Action]:
    """`member` failed (`failed`: its failing rank, when a trainer's): every node's trainer
    starts again while restarts are left, else the job ends with `code`. A job being stopped
    (preemption, scancel) is not started again."""
    summary = failure_summary(failed, job.name(member)) if failed else ""
    stopping = next((sig for sig in job.received if sig in STOPPING), None)
    if stopping is not None:
        who = job.name(job.received[stopping])
        return end(
            job,
            128 + stopping,
            f"{reason}; no restart: {who} received {signal_name(stopping)}",
            summary,
            sig=stopping,
        )
    if job.restarts_left > 0 and code != EXIT_CONFIG:
        job.restarts_left -= 1
        alive = [m for m, s in job.members.items() if s.connected]
        job.next_start(alive if job.roster.elastic else range(job.expected), now)
        used = job.limits.max_restarts - job.restarts_left
        actions: list[Action] = [Log("error", summary)] if summary else []
        return [
            *actions,
            Log(
                "warning",
                f"{reason}; restarting every {job.unit}'s trainer "
                f"(restart {used} of {job.limits.max_restarts})",
            ),
            Send(ALL, Restart(job.generation, reason)),
        ]
    return end(job, code, reason, summary)


def restart(job: JobState, reason: str, alive: Iterable[int], now: float) -> list[Action]:
    """A node lost with a standby to take its seat, enough nodes left to shrink, or a node
    restarted by its platform: every node's trainer starts again, seated anew at the next `go`
    (no restart is counted)."""
    job.next_start(alive, now)
    return [
        Log("warning", f"{reason}; restarting every {job.unit}'s trainer without it"),
        Send(ALL, Restart(job.generation, reason)),
    ]


def end(
    job: JobState, code: int, reason: str, summary: str = "", sig: int | None = None
) -> list[Action]:
    """The job ends with `code`: every node is told why. `sig`: the job stops because a node
    received it, and the other nodes pass it to their workers (else they get SIGTERM)."""
    job.phase, job.outcome = END, (code, reason)
    job.failures, job.decide_at = {}, None
    actions: list[Action] = [Log("error", summary)] if summary else []
    return [
        *actions,
        Log("error", f"stopping every {job.unit} (exit {code}): {reason}"),
        Send(ALL, stop_message(code, reason, sig)),
    ]


def stop_message(code: int, reason: str, sig: int | None = None) -> Stop:
    return Stop(code, reason, sig or None)
