"""Who trains in which node rank: node 0's seating of its members, pure.

A *member* is a node as its platform counts it (0 .. N+S-1, fixed for its life: the handshake
proves it). A *seat* is a node rank of the trainer's job (0 .. n-1), what torchrun's
`--node-rank` and `--nnodes` say. Without spares or shrinking, member m sits in seat m. With
ENTRYPOINT_SPARES=S the last S members stand by (no seat); with ENTRYPOINT_MIN_NODES=M the job
may run on fewer seats than it was planned for, never fewer than M.

`seat()` decides the next start from the last one and the members alive now:
- a member that trained keeps its seat when the job keeps its size (its checkpoint shard, its
  data position and its log stay where they were);
- an empty seat goes to the lowest standby (a spare, or a node its platform replaced);
- with no standby left the job shrinks: survivors whose seat is past the new size move down
  into the empty seats, so the ranks stay contiguous;
- with standbys again (a replaced node came back), the job grows back to its planned size.
The *head* serves the control channel and the rendezvous, so it always sits in seat 0: member 0,
or, once node 0 was lost, the member that holds node 0's seat in etcd (consensus/election.py;
the seat it leaves is filled as any lost member's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Roster:
    """The job's shape as its settings made it: `members` started, `full` seats, and the
    fewest seats it may run on."""

    members: int
    full: int
    min_nodes: int

    @property
    def spares(self) -> int:
        return self.members - self.full

    @property
    def elastic(self) -> bool:
        """Whether a lost node can be replaced or left out (else it ends the job)."""
        return self.spares > 0 or self.min_nodes < self.full

    def first(self) -> dict[int, int]:
        """The seats at the first start: member m in seat m, spares standing by."""
        return {m: m for m in range(self.full)}


def seat(
    roster: Roster,
    previous: Mapping[int, int],
    alive: Iterable[int],
    domains: Mapping[int, str] | None = None,
    head: int = 0,
) -> dict[int, int]:
    """member -> seat for the next start; the members alive and left out stand by. Fewer than
    `roster.min_nodes` seats is the caller's to refuse (len() of the result). `domains`: each
    member's NVLink domain; a seat a lost member leaves goes to a standby of its domain first
    (its GPUs share the NVLink fabric of the seats around it, as on a GB200 NVL72). `head`: the
    member that serves the job (node 0); it sits in seat 0, and with it gone nobody is seated."""
    alive = sorted(set(alive))
    if head not in alive:
        return {}
    domains = domains or {}
    size = min(roster.full, len(alive))
    others = [m for m in alive if m != head]
    stayed = sorted((m for m in others if m in previous), key=lambda m: previous[m])
    seats = {head: 0} | {m: previous[m] for m in stayed if 0 < previous[m] < size}
    free = [s for s in range(size) if s not in seats.values()]
    moving = [m for m in stayed if m not in seats]  # seated past the new size: shrink
    waiting = [m for m in others if m not in previous]  # standbys, lowest member first
    for member in moving:
        if free:
            seats[member] = free.pop(0)
    held = {place: m for m, place in previous.items()}  # who sat in each seat before
    for place in list(free):
        if not waiting:
            break
        domain = domains.get(held.get(place, -1), "")
        same = [m for m in waiting if domain and domains.get(m) == domain]
        member = (same or waiting)[0]
        waiting.remove(member)
        seats[member] = place
        free.remove(place)
    return seats


def changes(previous: Mapping[int, int], now: Mapping[int, int]) -> list[str]:
    """What changed between two seatings, one phrase each (node 0 logs them)."""
    out = []
    for member, place in sorted(now.items(), key=lambda item: item[1]):
        before = previous.get(member)
        if before is None:
            out.append(f"node {member} takes node rank {place}")
        elif before != place:
            out.append(f"node {member} moves from node rank {before} to {place}")
    return out
