"""What a node's messages carry of its ranks, as node 0 reads them off the wire: the failing rank
of an exit (`Failure`, from entrypoint.supervise.failures), one rank's progress (`RankReport`,
from the site hook's step hook, entrypoint.trainer_side.step_hook, through the node's inbox,
entrypoint.supervise.rank_inbox) and its stack when node 0 asked (`RankStack`). Node 0 judges
them in entrypoint.coordinator (verdicts, rank_judgement)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from entrypoint.control.message_fields import (
    MAX_RANKS,
    BadMessage,
    bool_field,
    check_collectives,
    check_frames,
    float_field,
    int_field,
    str_field,
    strings_field,
)


@dataclass(frozen=True)
class Failure:
    """What a node says of its failing rank when its launcher exited with an error: the rank and
    local rank (None: not known), the exit code, the last lines of its stderr, when it failed (on
    its node's wall clock), how the launcher itself died when a signal killed it, and whether its
    own lines say it only lost a peer."""

    rank: int | None = None
    local_rank: int | None = None
    exitcode: int | None = None
    tail: tuple[str, ...] = ()
    time: float | None = None
    killed: str = ""
    peer_lost: bool = False

    @classmethod
    def from_wire(cls, raw: Any) -> Failure | None:
        if raw is None:
            return None
        if type(raw) is not dict:
            raise BadMessage("failure must be an object or null")
        return cls(
            rank=int_field(raw, "rank", 0, 1 << 30, None),
            local_rank=int_field(raw, "local_rank", 0, 1 << 16, None),
            exitcode=int_field(raw, "exitcode", -255, 255, None),
            tail=strings_field(raw, "tail", 100, 4096),
            time=float_field(raw, "time", None),
            killed=str_field(raw, "killed", 1024, "") or "",
            peer_lost=bool_field(raw, "peer_lost", False),
        )


@dataclass(frozen=True)
class RankReport:
    """One rank as a node's heartbeat reports it."""

    rank: int
    steps: int
    age: float  # seconds since its last step, on its node's clock, when the beat left
    lead: float | None  # mean seconds a step before backward since the last beat; None: unknown
    longest: float  # longest step interval since the last beat (0: none)
    saving: bool = False
    # seconds since its last forward pass in evaluation (None: none since its first step)
    evaluated: float | None = None
    # its default process group's collective timeout, seconds (None: unknown)
    timeout: float | None = None

    @classmethod
    def from_checked(cls, row: tuple) -> RankReport:
        """From a beat's row as message_fields.check_ranks checked it."""
        return cls(row[0], row[1], row[2], row[3], row[4], bool(row[5]), *row[6:8])

    def to_wire(self) -> list:
        wire = [
            self.rank,
            self.steps,
            round(self.age, 3),
            self.lead,
            round(self.longest, 4),
            int(self.saving),
        ]
        evaluated = None if self.evaluated is None else round(self.evaluated, 3)
        if self.timeout is not None:
            return [*wire, evaluated, round(self.timeout, 3)]
        return wire if evaluated is None else [*wire, evaluated]


# Where a rank waits for the others: a collective, the autograd engine (DDP's all-reduce runs
# inside backward), a barrier.
WAITING = (
    "torch/distributed/",
    "torch/autograd/",
    "torch/nn/parallel/",
    "deepspeed/comm/",
    "jax/_src/",  # a JAX process blocked in a dispatch waits for its devices' collectives
)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    source: str = ""


@dataclass(frozen=True)
class Collective:
    """A process group's last collective as one rank's Flight Recorder holds it."""

    group: str  # torch's id of the group: "0" is the default group
    description: str  # torch's: "default_pg", "undefined", or the name given by the trainer
    seq: int  # the group's collective sequence number, the same on every member
    op: str  # "nccl:all_reduce", "gloo:broadcast"
    detail: str  # the input's type and sizes: "float [[4,5]]"

    @property
    def group_name(self) -> str:
        if self.description and self.description != "undefined":
            return f"process group {self.group} ({self.description})"
        return f"process group {self.group}"


@dataclass(frozen=True)
class RankStack:
    member: int
    host: str
    rank: int
    steps: int
    frames: tuple[Frame, ...]  # the main thread's, innermost first
    collectives: tuple[Collective, ...] = ()  # each group's last; none where it did not answer

    @property
    def place(self) -> tuple[str, int, str] | None:
        if not self.frames:
            return None
        top = self.frames[0]
        return (top.file, top.line, top.function)

    @property
    def waiting(self) -> bool:
        return any(any(w in f.file for w in WAITING) for f in self.frames[:4])


@dataclass(frozen=True)
class RankDump:
    """One rank's answer to node 0's `dump`, as its node sends it: its steps, its main-thread
    stack (innermost first) and, where its Flight Recorder answered, each process group's last
    collective. Node 0 places it on its node (`at`)."""

    rank: int
    steps: int
    frames: tuple[Frame, ...] = ()
    collectives: tuple[Collective, ...] = ()

    @classmethod
    def from_wire(cls, raw: Any) -> RankDump:
        if type(raw) is not dict:
            raise BadMessage("each of ranks must be an object")
        return cls(
            rank=int_field(raw, "rank", -1, 1 << 30),
            steps=int_field(raw, "steps", 0, 1 << 62),
            frames=tuple(Frame(*f) for f in check_frames(raw.get("frames"))),
            collectives=tuple(
                Collective(*c) for c in check_collectives(raw.get("collectives", []))
            ),
        )

    def to_wire(self) -> dict:
        wire: dict[str, Any] = {
            "rank": self.rank,
            "steps": self.steps,
            "frames": [[f.file, f.line, f.function, f.source] for f in self.frames],
        }
        if self.collectives:
            wire["collectives"] = [
                [c.group, c.description, c.seq, c.op, c.detail] for c in self.collectives
            ]
        return wire

    def at(self, member: int, host: str) -> RankStack:
        return RankStack(member, host, self.rank, self.steps, self.frames, self.collectives)


def rank_dumps(raw: Any) -> tuple[RankDump, ...]:
    """A node's ranks' answers, as a `stacks` message carries them."""
    if type(raw) is not list or len(raw) > MAX_RANKS:
        raise BadMessage(f"ranks must be a list of at most {MAX_RANKS}")
    return tuple(RankDump.from_wire(r) for r in raw)
