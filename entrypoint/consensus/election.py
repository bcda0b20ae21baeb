"""Who is node 0, decided by etcd: the member whose key `<job>/node0` exists, bound to its lease.
A member takes the seat only by creating that key in one transaction (its create revision must
be 0), so two never hold it at once; the key's create revision is the holder's term, growing with
each new holder. The job's state is written only while the writer's term still holds (one
transaction again), so a node 0 that lost its seat cannot overwrite its successor's."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from entrypoint.consensus.etcd import Etcd, EtcdRefused, EtcdUnreachable, Value


@dataclass(frozen=True)
class Holder:
    """Node 0: the member, its host, where its control channel listens, and its term."""

    member: int
    host: str
    address: str
    term: int = 0

    def record(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k != "term"})

    @classmethod
    def of(cls, value: Value) -> Holder:
        fields = value.json()
        return cls(
            int(fields["member"]), str(fields["host"]), str(fields["address"]), value.created
        )


def seat_key(job: str) -> str:
    return f"/multinode/{job}/node0"


def state_key(job: str) -> str:
    return f"/multinode/{job}/state"


def hangups_root(job: str) -> str:
    """Where the members that a node 0 hung up on say so, under its term."""
    return f"/multinode/{job}/hungup/"


def hangups_key(job: str, term: int) -> str:
    """Where the members that node 0 of `term` hung up on say so, a key each."""
    return f"{hangups_root(job)}{term}/"


def hang_up(etcd: Etcd, job: str, term: int, member: int) -> None:
    """Say that node 0 of `term` hung up on `member`."""
    etcd.put(f"{hangups_key(job, term)}{member}", "")


def hung_up_on(etcd: Etcd, job: str, term: int) -> frozenset[int]:
    """The members that node 0 of `term` hung up on, as they said."""
    return frozenset(int(k.rsplit(b"/", 1)[1]) for k in etcd.keys(hangups_key(job, term)))


def forget_hangups(etcd: Etcd, job: str) -> None:
    """The hang-ups said of every node 0 before the one that holds the seat now."""
    etcd.delete(hangups_root(job), prefix=True)


def depose(etcd: Etcd, job: str, term: int) -> bool:
    """End the lease of node 0 of `term` now, if it still holds the seat: the seat is free.
    True if it did."""
    value = etcd.get(seat_key(job))
    if value is None or value.created != term or not value.lease:
        return False
    etcd.revoke(value.lease)
    return True


def campaign(etcd: Etcd, job: str, me: Holder, lease: int) -> Holder:
    """Take node 0's seat if it is free; the holder either way (me, with my term, if I won)."""
    _, value = etcd.create(seat_key(job), me.record(), lease)
    if value is None:  # the transaction reads the key either way: etcd's answer always has it
        raise EtcdRefused(f"etcd's answer to a campaign for {seat_key(job)} has no holder", 0)
    return Holder.of(value)


def holder(etcd: Etcd, job: str) -> Holder | None:
    value = etcd.get(seat_key(job))
    return Holder.of(value) if value else None


def wait_vacant(etcd: Etcd, job: str, timeout: float) -> bool:
    """Block until node 0's seat is free (its holder's lease ended or it stepped down), or
    timeout seconds pass: True if free. Watches the key, so nothing polls etcd meanwhile."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        value = etcd.get(seat_key(job))
        if value is None:
            return True
        try:
            for event in etcd.watch(seat_key(job), value.modified + 1, left):
                if event.kind == "DELETE":
                    return True
        except EtcdUnreachable:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    return False


def publish(etcd: Etcd, job: str, me: Holder, state: dict[str, object]) -> bool:
    """Write the job's state as node 0 of term `me.term`; False (nothing written) if that term
    has ended."""
    return etcd.put_if(state_key(job), json.dumps(state, sort_keys=True), seat_key(job), me.term)


def read_state(etcd: Etcd, job: str) -> dict[str, object] | None:
    value = etcd.get(state_key(job))
    return value.json() if value else None
