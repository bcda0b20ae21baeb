"""The job's small state as node 0 writes it to etcd (docs/failures.md, "Losing node 0"), and
the state a new node 0 goes on from. Pure: `record_of` reads node 0's `JobState`, `resumed`
builds the successor's from the record and the members still alive; etcd's reads and writes are
entrypoint.consensus's.

What is kept: the members' hosts, the last seating, the lost and sick members with why, the
generation and the restarts left, the job token's digest. What is not: connections, beats,
figures, ranks' progress, failures awaiting their verdict (the new node 0 starts with the next
generation's join, and each member says hello again)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from entrypoint.coordinator.roster import Roster, seat
from entrypoint.coordinator.state import JobState, Limits

VERSION = 1  # a record of another version is refused, not guessed at
# Why a job cannot go on without any one of its nodes, node 0 included
NOT_ELASTIC = "the job has no spare and no minimum (ENTRYPOINT_SPARES, ENTRYPOINT_MIN_NODES)"


@dataclass(frozen=True)
class JobRecord:
    """What a new node 0 needs to go on with the job."""

    head: int  # the member that wrote it, node 0 of its term
    generation: int
    restarts_left: int
    seats: dict[int, int]  # member -> node rank, the last start
    hosts: dict[int, str]  # each member's host, as it said hello
    lost: dict[int, str] = field(default_factory=dict)
    sick: dict[int, str] = field(default_factory=dict)
    token_digest: str = ""  # sha256 of the job token, never the token
    etcd: tuple[str, ...] = ()  # the job's own etcd members, "MEMBER=HOST" (JobState.etcd)

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, **asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> JobRecord:
        """The record written by `to_json`; ValueError names what is wrong with any other."""
        try:
            raw = json.loads(text)
            if raw.pop("version", None) != VERSION:
                raise ValueError(f"not a job record of version {VERSION}")
            return cls(
                head=int(raw["head"]),
                generation=int(raw["generation"]),
                restarts_left=int(raw["restarts_left"]),
                seats={int(m): int(s) for m, s in raw["seats"].items()},
                hosts={int(m): str(h) for m, h in raw["hosts"].items()},
                lost={int(m): str(w) for m, w in raw.get("lost", {}).items()},
                sick={int(m): str(w) for m, w in raw.get("sick", {}).items()},
                token_digest=str(raw.get("token_digest", "")),
                etcd=tuple(str(x) for x in raw.get("etcd", ())),
            )
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a job record: {exc}") from None


def record_of(job: JobState, token_digest: str = "") -> JobRecord:
    """Node 0's record of `job` now: what it writes at each `go`, loss and restart."""
    hosts = {m: s.host for m, s in job.seen.items()} | {m: s.host for m, s in job.members.items()}
    return JobRecord(
        head=job.head,
        generation=job.generation,
        restarts_left=job.restarts_left,
        seats=dict(job.seats),
        hosts=hosts,
        lost=dict(job.lost),
        sick=dict(job.sick),
        token_digest=token_digest,
        etcd=job.etcd,
    )


def cannot_go_on(roster: Roster, record: JobRecord, head: int, alive: Iterable[int]) -> str | None:
    """Why the job cannot go on without its node 0 on `head` and the members `alive`, or None
    if it can: as for any lost node, only a job with spares or a minimum (ENTRYPOINT_SPARES,
    ENTRYPOINT_MIN_NODES) goes on, and only on enough seats."""
    if not roster.elastic:
        return NOT_ELASTIC
    seats = seat(roster, record.seats, set(alive) | {head}, head=head)
    if len(seats) < roster.min_nodes:
        return f"only {len(seats)} can train, the job needs {roster.min_nodes}"
    return None


def resumed(
    record: JobRecord,
    head: int,
    alive: Iterable[int],
    *,
    expected: int,
    limits: Limits,
    roster: Roster,
    now: float,
    unit: str = "node",
    address: str = "?",
    why: str = "",
) -> JobState:
    """The job's state on its new node 0, member `head`, which holds node 0's seat now: the
    record's seating, restarts and losses, the old node 0 lost (`why`), and the next
    generation's join waiting for the members still alive (`alive`, the head among them)."""
    job = JobState(
        expected, limits, roster, now, unit, address, head=head, etcd_members=len(record.etcd)
    )
    job.etcd = record.etcd
    job.generation = record.generation
    job.restarts_left = record.restarts_left
    job.seats = dict(record.seats)
    job.lost = dict(record.lost) | {record.head: why or "node 0 was lost"}
    # The old node 0 has ended, its etcd member with it: killed, or fenced (its lease lost) and
    # out. Started again, it runs none (supervise/own_etcd.py): its member counts as gone.
    job.gone = {record.head}
    job.sick = dict(record.sick)
    job.next_start(sorted(set(alive) | {head}), now)
    return job
