"""A hang, over the job's state: no rank has stepped for the hang timeout in force (`rule`), so
node 0 asks every node for its ranks' stacks (`check`), gathers them (`answered`) and names the
rank that is not where the others are (`judge`), ending or restarting the job through its
verdicts. The rules on the stacks themselves are entrypoint.coordinator.rank_judgement's."""

from __future__ import annotations

from entrypoint.control.actions import ALL, Action, Log, Send
from entrypoint.control.messages import Dump, Stacks
from entrypoint.control.rank_records import RankReport
from entrypoint.coordinator.rank_judgement import (
    STACKS_WAIT,
    HangRule,
    hang_reason,
    hang_rule,
    hang_setting_warning,
)
from entrypoint.coordinator.state import RUN, JobState, StackProbe
from entrypoint.coordinator.verdicts import failure
from entrypoint.plan.errors import EXIT_HUNG


def rule(job: JobState) -> HangRule:
    """The hang timeout in force: ENTRYPOINT_HANG_TIMEOUT, or learned from the steps."""
    p, lim = job.progress, job.limits
    return hang_rule(
        lim.hang_timeout, p.longest, p.warmed, lim.collective_timeout, p.group_timeout()
    )


def check_setting(job: JobState, reports: list[RankReport]) -> list[Action]:
    """ENTRYPOINT_HANG_TIMEOUT at or above torch's own timeout is said, once."""
    warned = job.hang_setting_warned
    said = None if warned else hang_setting_warning(job.limits.hang_timeout, reports)
    job.hang_setting_warned = warned or said is not None
    return [Log("warning", said)] if said else []


def answered(job: JobState, member: int, message: Stacks, now: float) -> list[Action]:
    """A node's ranks' stacks: once every node training has answered, the hang is judged."""
    state = job.members.get(member)
    if job.probe is None or job.phase != RUN or state is None:
        return []
    job.probe.answers[member] = message.stacks(member, state.host)
    return judge(job, now) if _all_answered(job) and not job.failures else []


def _training(job: JobState) -> list[int]:
    return sorted(m for m, s in job.members.items() if s.connected and m in job.seats)


def _all_answered(job: JobState) -> bool:
    assert job.probe is not None
    return set(_training(job)) <= job.probe.answers.keys()


def check(job: JobState, now: float) -> list[Action]:
    """The clock's look at the ranks' steps: the stacks asked for once none stepped for the
    timeout, judged when STACKS_WAIT ran out; nothing while a failure awaits its verdict (it,
    not a hang, is the cause)."""
    if job.failures:
        job.probe = None
        return []
    if job.probe is not None:
        return judge(job, now) if now >= job.probe.deadline else []
    in_force = rule(job)
    silent = job.progress.stalled(now, in_force.seconds)
    if silent is None:
        return []
    job.probe = StackProbe(silent, in_force, now + STACKS_WAIT)
    return [
        Log(
            "warning",
            f"no rank has stepped for {silent:.0f} s (hang timeout {in_force.seconds:g} s, "
            f"{in_force.source}): asking every {job.unit} for its ranks' stacks",
        ),
        Send(ALL, Dump(round(silent, 1))),
    ]


def judge(job: JobState, now: float) -> list[Action]:
    """The hang named, from the stacks that came: the rank not where the others are, or the
    node that did not answer."""
    probe, job.probe = job.probe, None
    assert probe is not None
    training = _training(job)
    blamed, reason = hang_reason(
        probe.answers,
        probe.silent,
        probe.rule,
        {m: job.name(m) for m in job.members},
        [m for m in training if m not in probe.answers],
    )
    member = blamed if blamed is not None else min(training, default=0)
    return failure(job, member, None, reason, EXIT_HUNG, now)
