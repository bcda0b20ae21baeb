"""Every rank's progress as node 0 sees it, and what follows from it: a hang, a slow rank, the
job's goodput. Pure: the caller passes `now` (node 0's monotonic seconds).

The nodes' heartbeats carry their ranks' reports (`RankReport`, from the site hook's optimizer-step
hook, entrypoint.trainer_side.step_hook). From them:

- **Hang.** Ranks that were stepping and have not stepped for `HangRule.seconds`, none of them
  saving a checkpoint: node 0 asks every node for its ranks' stacks, and `verdict` names the
  rank(s) that are not where the others are.
- **Slow rank.** In a synchronous job every rank steps at the slowest one's pace, so step
  intervals are equal; what differs is the time each rank spends on its own work (loading data,
  forward: a torch rank's time before backward, a JAX process's time outside JAX): a rank whose
  own work is well above the job's median in every sample of the window is the one every step
  waits for. Equal ranks are never named.
- **Goodput.** The share of wall time since the first step in which the job was stepping (a step
  seen within a few step intervals).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from entrypoint.control.rank_records import Collective, Frame, RankReport, RankStack

WARMUP_STEPS = 10  # steps every rank makes before the learned hang timeout is trusted
HANG_FLOOR = 180.0  # seconds: the learned timeout is never shorter
HANG_FACTOR = 10.0  # times the longest step interval seen after warm-up
HANG_CAP_SHARE = 0.75  # of the collective timeout: a hang is named before torch's timeout fires
STACKS_WAIT = 5.0  # seconds node 0 waits for every node's stacks before it judges without them

SLOW_SHARE = 1.5  # a rank's time before backward over the job's median, in every sample
SLOW_MIN_GAP = 0.02  # seconds a step: below that nobody is named (noise)
SAMPLES_PER_WINDOW = 24  # slow-rank samples a window holds: one per window / 24 seconds
LEADS_KEPT = 64  # samples kept per rank: 2.7 windows


@dataclass
class RankState:
    member: int
    rank: int
    steps: int = 0
    last_step: float = 0.0  # node 0's monotonic time
    last_active: float = 0.0  # its last step or forward pass in evaluation, node 0's time
    saving: bool = False
    timeout: float | None = None  # its default process group's collective timeout, seconds
    interval: float | None = None  # mean step interval, from the steps between two beats
    leads: deque = field(default_factory=lambda: deque(maxlen=LEADS_KEPT))  # (now, mean lead)
    _prev: tuple[float, int] | None = None  # (last_step, steps) at the previous beat
    _pending: tuple[float, int] = (0.0, 0)  # leads summed since the last sample, and how many

    def add_lead(self, now: float, lead: float, every: float) -> None:
        """A beat's mean lead, kept as one sample per `every` seconds (the mean of the beats
        between): beats come every second, and a window of samples must span the window."""
        total, count = self._pending[0] + lead, self._pending[1] + 1
        if self.leads and now - self.leads[-1][0] < every:
            self._pending = (total, count)
            return
        self.leads.append((now, total / count))
        self._pending = (0.0, 0)


@dataclass(frozen=True)
class HangRule:
    seconds: float  # 0: off
    source: str


def hang_rule(
    setting: float | None,
    longest: float,
    warmed: bool,
    collective_timeout: float,
    group_timeout: float | None = None,
) -> HangRule:
    """ENTRYPOINT_HANG_TIMEOUT, else learned: max(HANG_FLOOR, HANG_FACTOR x the longest step
    interval seen after warm-up), capped at HANG_CAP_SHARE of the collective timeout (before
    warm-up: the cap). The collective timeout: ENTRYPOINT_COLLECTIVE_TIMEOUT, or the trainer's
    own process group's (`group_timeout`, as its ranks report it) where that is shorter, so
    that the hang is named before torch's timeout fails the job naming no rank."""
    if setting is not None:
        return HangRule(setting, "ENTRYPOINT_HANG_TIMEOUT")
    if group_timeout is not None and group_timeout < collective_timeout:
        cap = HANG_CAP_SHARE * group_timeout
        capped = f"{HANG_CAP_SHARE:g} x the trainer's process-group timeout ({group_timeout:g} s)"
    else:
        cap = HANG_CAP_SHARE * collective_timeout
        capped = f"{HANG_CAP_SHARE:g} x ENTRYPOINT_COLLECTIVE_TIMEOUT"
    if not warmed:
        return HangRule(cap, f"{capped} (warming up)")
    learned = max(HANG_FLOOR, HANG_FACTOR * longest)
    if learned >= cap:
        return HangRule(cap, capped)
    return HangRule(
        learned,
        f"learned: {HANG_FACTOR:g} x the longest step seen ({longest:.2f} s), at least "
        f"{HANG_FLOOR:g} s",
    )


def hang_setting_warning(setting: float | None, reports: Iterable[RankReport]) -> str | None:
    """The warning for an ENTRYPOINT_HANG_TIMEOUT that the trainer's own collective timeout (as
    one beat's ranks report it: node 0 gets a beat from every node every second) fires before;
    torch's error then names no rank. None when there is nothing to say."""
    if not setting:
        return None
    group_timeout = min((r.timeout for r in reports if r.timeout), default=None)
    if group_timeout is None or setting < group_timeout:
        return None
    return (
        f"ENTRYPOINT_HANG_TIMEOUT={setting:g} is not below the trainer's process-group timeout "
        f"({group_timeout:g} s, as its ranks report it): a rank that hangs fails the job with "
        f"torch's timeout first, naming no rank; set ENTRYPOINT_HANG_TIMEOUT below "
        f"{group_timeout:g}, or unset it (learned, below that timeout)"
    )


class JobProgress:
    """Every rank's steps, from the beats; node 0's Conductor holds one."""

    def __init__(self) -> None:
        self.ranks: dict[tuple[int, int], RankState] = {}  # (member, rank): state
        self.longest = 0.0  # the longest step interval seen after warm-up, any rank
        self.first_step: float | None = None  # the job's first step (node 0's clock)
        self.stepping = 0.0  # seconds since then that the job was stepping
        self._last_tick: float | None = None

    def beat(
        self, member: int, reports: Iterable[RankReport], now: float, window: float = 120.0
    ) -> None:
        """A node's ranks, as its beat says; a rank the node no longer reports has ended.
        `window`: the slow-rank window (ENTRYPOINT_SLOW_NODE_WINDOW), which sets how often a
        rank's lead is sampled."""
        seen = set()
        for r in reports:
            key = (member, r.rank)
            seen.add(key)
            state = self.ranks.get(key) or RankState(member, r.rank)
            self.ranks[key] = state
            if r.steps > 0:
                state.last_step = now - r.age
                if self.first_step is None:
                    self.first_step = state.last_step
            evaluated = now - r.evaluated if r.evaluated is not None else 0.0
            state.last_active = max(state.last_step, evaluated)
            if state._prev is not None and r.steps > state._prev[1]:
                state.interval = (state.last_step - state._prev[0]) / (r.steps - state._prev[1])
            state._prev = (state.last_step, r.steps)
            if r.steps >= WARMUP_STEPS and r.longest > self.longest and state.steps >= WARMUP_STEPS:
                self.longest = r.longest
            state.steps, state.saving = r.steps, r.saving
            state.timeout = r.timeout if r.timeout is not None else state.timeout
            if r.lead is not None:
                state.add_lead(now, r.lead, window / SAMPLES_PER_WINDOW)
        for key in [k for k in self.ranks if k[0] == member and k not in seen]:
            del self.ranks[key]

    def forget(self, member: int) -> None:
        for key in [k for k in self.ranks if k[0] == member]:
            del self.ranks[key]

    def restart(self) -> None:
        """A new start: the ranks of the last one are gone; goodput counts on."""
        self.ranks.clear()
        self._last_tick = None

    def group_timeout(self) -> float | None:
        """The shortest process-group timeout the ranks reported (None: none did)."""
        return min((s.timeout for s in self.ranks.values() if s.timeout), default=None)

    @property
    def warmed(self) -> bool:
        stepping = [s for s in self.ranks.values() if s.steps]
        return bool(stepping) and all(s.steps >= WARMUP_STEPS for s in stepping)

    def stalled(self, now: float, seconds: float) -> float | None:
        """Seconds since the job's last step, when every rank that stepped has been still (no
        step, no forward pass in evaluation) for longer than `seconds` and none is saving;
        else None."""
        stepping = [s for s in self.ranks.values() if s.steps]
        if seconds <= 0 or not stepping or any(s.saving for s in self.ranks.values()):
            return None
        silent = now - max(s.last_active for s in stepping)
        oldest = now - min(s.last_active for s in stepping)
        return oldest if silent > seconds else None

    def tick(self, now: float, heartbeat: float) -> None:
        """Goodput: the time since the last tick counts as stepping when a step was seen within
        3 step intervals (and the beats' own delay)."""
        last, self._last_tick = self._last_tick, now
        stepping = [s for s in self.ranks.values() if s.steps]
        if last is None or not stepping or self.first_step is None:
            return
        intervals = [s.interval for s in stepping if s.interval]
        typical = statistics.median(intervals) if intervals else 0.0
        latest = max(s.last_step for s in stepping)
        if now - latest <= 3 * typical + 2 * heartbeat + 0.5:
            self.stepping += now - last

    def goodput(self, now: float) -> float | None:
        if self.first_step is None or now - self.first_step <= 0:
            return None
        return min(1.0, self.stepping / (now - self.first_step))

    def steps(self) -> int:
        """The job's steps: the fewest any rank has made."""
        stepping = [s.steps for s in self.ranks.values()]
        return min(stepping) if stepping else 0


def slow_ranks(
    states: Iterable[RankState], now: float, window: float
) -> dict[tuple[int, int], str]:
    """{(member, rank): why} for each rank whose time before backward stayed above the job's
    median by SLOW_SHARE (and SLOW_MIN_GAP) in every sample of the last `window` seconds; a rank
    needs samples spanning most of the window to be judged."""
    recent = {}
    for s in states:
        samples = [lead for at, lead in s.leads if now - at <= window]
        span = [at for at, _ in s.leads if now - at <= window]
        if len(samples) >= 3 and span and span[-1] - span[0] >= 0.6 * window:
            recent[(s.member, s.rank)] = samples
    if len(recent) < 2:
        return {}
    means = {key: statistics.fmean(v) for key, v in recent.items()}
    out = {}
    for key, samples in recent.items():
        others = [m for k, m in means.items() if k != key]
        median = statistics.median(others)
        bar = max(SLOW_SHARE * median, median + SLOW_MIN_GAP)
        if all(lead > bar for lead in samples):
            out[key] = (
                f"{means[key]:.3f} s a step of its own work (data loading, forward) against "
                f"the other ranks' median {median:.3f} s, for {window:g} s: every synchronous "
                "step waits for it"
            )
    return out


def slow_rank_news(
    before: Mapping[tuple[int, int], str],
    now: Mapping[tuple[int, int], str],
    present: Iterable[tuple[int, int]],
) -> list[tuple[str, int, int, str]]:
    """(level, member, rank, text) to log: a rank newly slow, once, with why; a rank slow
    before that keeps pace now, once."""
    out = [
        ("warning", m, r, f"is slow: {why}")
        for (m, r), why in sorted(now.items())
        if (m, r) not in before
    ]
    still = set(present)
    out += [
        ("info", m, r, "keeps pace again")
        for (m, r) in sorted(before)
        if (m, r) not in now and (m, r) in still
    ]
    return out


# -- a hang's verdict, from every rank's stack --------------------------------------------------

LIBRARY = ("site-packages/", "dist-packages/", "/lib/python3", "entrypoint/trainer_side/")


def _short(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path.rsplit("/", 1)[-1]


def where(frames: Sequence[Frame]) -> str:
    """`train.py:42 (time.sleep(3600))`, or `all_reduce (torch/distributed/...:2950), from
    train.py:40 (loss.backward())` when the innermost frame is a library's."""
    if not frames:
        return "no Python stack (the process did not answer)"
    own = next((f for f in frames if not any(m in f.file for m in LIBRARY)), None)

    def at(f: Frame) -> str:
        text = f"{_short(f.file)}:{f.line}"
        return f"{text} ({f.source})" if f.source else f"{text} in {f.function}"

    top = frames[0]
    if own is top:
        return at(top)
    text = f"{top.function} ({_short(top.file)}:{top.line})"
    return f"{text}, from {at(own)}" if own is not None else text


def ranks_text(ranks: Sequence[int]) -> str:
    """`rank 3`, `ranks 0-2`, `ranks 0, 2, 5`."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    shown = ", ".join(str(r) for r in ranks[:12]) + (" ..." if len(ranks) > 12 else "")
    return f"ranks {shown}"


def suspects(stacks: Sequence[RankStack]) -> list[RankStack]:
    """The ranks not where the others are: outside the largest group of ranks sharing their
    innermost frame (of those, the ones not waiting in a collective or a dispatch, if some
    wait: JAX's waiting processes stand in several places, in the step's call or in the next
    eager operation queued behind it); when no group is largest, those not waiting; else the
    ranks with the fewest steps; else every rank."""
    if not stacks:
        return []
    groups: dict[object, list[RankStack]] = {}
    for s in stacks:
        groups.setdefault(s.place, []).append(s)
    sizes = sorted((len(g) for g in groups.values()), reverse=True)
    if len(groups) > 1 and sizes[0] > sizes[1]:
        largest = max(groups.values(), key=len)
        outside = [s for s in stacks if s not in largest]
        return [s for s in outside if not s.waiting] or outside
    if len(groups) > 1:
        busy = [s for s in stacks if not s.waiting]
        if busy and len(busy) < len(stacks):
            return busy
    fewest = min(s.steps for s in stacks)
    behind = [s for s in stacks if s.steps == fewest]
    return behind if len(behind) < len(stacks) else list(stacks)


def never_entered(stacks: Sequence[RankStack], culprits: Sequence[RankStack]) -> str:
    """What torch's Flight Recorder says of the ranks that answered: in the process group where
    ranks are behind (a culprit's first), the collective some entered and the others never did;
    when every rank answered, entered the same last collective of every group and waits in a
    collective, that the wait is inside it; else ""."""
    answered = [s for s in stacks if s.collectives]
    if not answered:
        return ""
    groups: dict[str, dict[int, Collective]] = {}
    for s in answered:
        for c in s.collectives:
            groups.setdefault(c.group, {})[s.rank] = c
    blamed = {s.rank for s in culprits}
    split = []
    for group, last in groups.items():
        top = max(c.seq for c in last.values())
        behind = sorted(r for r, c in last.items() if c.seq < top)
        if behind:
            split.append((not blamed & set(behind), group != "0", group, top, behind))
    silent = [s.rank for s in stacks if not s.collectives]
    if not split:
        # one that did not answer may be the one behind; one outside a collective is not in it
        if silent or not all(s.waiting for s in stacks):
            return ""
        c = next(iter(groups.get("0", next(iter(groups.values()))).values()))
        return (
            f"torch's Flight Recorder: every rank entered collective #{c.seq} ({c.op}, "
            f"{c.detail}) of {c.group_name} last: the wait is inside it"
        )
    *_, group, top, behind = min(split)
    last = groups[group]
    ahead = sorted(r for r, c in last.items() if c.seq == top)
    c = last[ahead[0]]
    by_seq: dict[int, list[int]] = {}
    for r in behind:
        by_seq.setdefault(last[r].seq, []).append(r)
    lasts = ", ".join(f"#{seq} by {ranks_text(rs)}" for seq, rs in sorted(by_seq.items())[:3])
    return (
        f"torch's Flight Recorder: {ranks_text(behind)} never entered collective #{top} "
        f"({c.op}, {c.detail}) of {c.group_name}, which {ranks_text(ahead)} entered; last "
        f"entered: {lasts}" + (f"; {ranks_text(silent)} gave no record" if silent else "")
    )


def verdict(
    stacks: Sequence[RankStack], silent: float, name: Mapping[int, str], missing: Sequence[str] = ()
) -> tuple[int | None, str]:
    """(the member to blame, the one failure line). `name`: member -> `node 1 (host)`."""
    if not stacks:
        return None, (
            f"no rank has stepped for {silent:.0f} s and no node sent its ranks' stacks"
            + (f" ({', '.join(missing)} did not answer)" if missing else "")
        )
    culprits = suspects(stacks)
    first = culprits[0]
    if len(culprits) == len(stacks):
        head = f"every rank has been still for {silent:.0f} s, none stands out: " + "; ".join(
            f"{ranks_text([s.rank])} on {name.get(s.member, s.member)} in {where(s.frames)}"
            for s in stacks[:8]
        )
    else:
        on = {s.member for s in culprits}
        node = name.get(first.member, f"node {first.member}") if len(on) == 1 else "several nodes"
        head = (
            f"{ranks_text([s.rank for s in culprits])} on {node} has not stepped for "
            f"{silent:.0f} s: in {where(first.frames)}"
        )
        others = [s for s in stacks if s not in culprits]
        by_place: dict[str, list[int]] = {}
        for s in others:
            by_place.setdefault(where(s.frames), []).append(s.rank)
        head += "; " + "; ".join(
            f"{ranks_text(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {place}"
            for place, ranks in list(by_place.items())[:3]
        )
    if missing:
        head += f" ({', '.join(missing)} sent no stacks)"
    flight = never_entered(stacks, [] if len(culprits) == len(stacks) else culprits)
    if flight:
        head += ". " + flight
    return first.member, head


def hang_reason(
    answers: Mapping[int, Sequence[RankStack]],
    silent: float,
    rule: HangRule,
    names: Mapping[int, str],
    missing: Sequence[int],
) -> tuple[int | None, str]:
    """(the member to blame, the failure line) once the nodes' stacks are in."""
    stacks = [s for member in sorted(answers) for s in answers[member]]
    blamed, text = verdict(stacks, silent, names, [names.get(m, f"node {m}") for m in missing])
    return blamed, (
        f"{text}. Hang timeout {rule.seconds:g} s ({rule.source}); every rank's full stack is "
        "in each node's log directory (stacks/)"
    )
