"""Node 0's control port against strangers and floods: why a hello is refused,
which connection still waiting for its hello gives way when too many wait, and warnings that
a flood cannot turn into a flood of log lines. Used by entrypoint.control.control_server."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from entrypoint.control import messages as m
from entrypoint.control.identity import Identity
from entrypoint.control.message_fields import shown
from entrypoint.control.transport import PROTOCOL

DROPS_LOGGED = 20  # drop lines per minute; past that, the next one says how many more
REFUSALS_LOGGED = 5  # refusal lines per address per window; past that, one line says how many
REFUSAL_WINDOW = 10.0  # seconds
MAX_REFUSING = 1024  # addresses counted apart; beyond, the others share one count
CANDIDATES = 8  # connections of the busiest address looked at to make room for one more


def refusal(identity: Identity, hello: m.Hello, member: int | None, nonce: str) -> str:
    """Why this hello does not come from a node of this job ('' when it does): `member` is
    what the connection joined as (None before), `nonce` node 0's challenge to it."""
    if hello.protocol != PROTOCOL:
        return (
            f"it speaks control protocol {hello.protocol}, node 0 speaks {PROTOCOL}: "
            "run the same image on every node"
        )
    if member is not None and hello.member != member:
        return f"it joined as node {member} and now says it is node {hello.member}"
    if hello.job != identity.job:
        return (
            f"it belongs to another job: {shown(hello.job) or 'no job identity'} there, "
            f"{identity.job or 'no job identity'} on node 0. Start every node of "
            "one job from one submission, or give them one ENTRYPOINT_JOB_ID"
        )
    token = identity.token
    if hello.auth != identity.auth:
        has, lacks = ("it", "node 0") if token is None else ("node 0", "it")
        return (
            f"{has} has a job token (ENTRYPOINT_JOB_TOKEN), {lacks} has none: give "
            "every node the same token, or none"
        )
    if token is not None and not m.same(
        hello.proof, m.hello_proof(token, nonce, hello.nonce, identity.job, hello.member)
    ):
        return (
            "wrong job token: its ENTRYPOINT_JOB_TOKEN is not node 0's. Give every "
            "node the same token"
        )
    return ""


class Waiting(Protocol):
    ip: str
    accepted: float


P = TypeVar("P", bound=Waiting)


class Pending(Generic[P]):
    """The connections accepted and not yet through their hello, by address, oldest first.
    When too many wait, the busiest address gives way first: a flood from one address
    delays another address's join, and cannot push it out."""

    def __init__(self) -> None:
        self.by_ip: dict[str, dict[P, None]] = {}
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, peer: P) -> None:
        held = self.by_ip.setdefault(peer.ip, {})
        if peer not in held:
            held[peer] = None
            self.count += 1

    def discard(self, peer: P) -> None:
        held = self.by_ip.get(peer.ip)
        if held is not None and held.pop(peer, 0) is None:
            self.count -= 1
            if not held:
                del self.by_ip[peer.ip]

    def crowded(self) -> list[P]:
        """The oldest few connections of the address holding the most."""
        if not self.by_ip:
            return []
        busiest = max(self.by_ip.values(), key=len)
        return list(itertools.islice(busiest, CANDIDATES))

    def older_than(self, when: float) -> Iterator[P]:
        return (p for held in self.by_ip.values() for p in list(held) if p.accepted < when)

    def all(self) -> list[P]:
        return [p for held in self.by_ip.values() for p in held]


class Warnings:
    """The control port's warnings, bounded: drops at most DROPS_LOGGED a minute, refusals
    REFUSALS_LOGGED per address per window; the rest are counted and said in one line."""

    def __init__(self, log: Callable[[str, str], None], refusal_window: float) -> None:
        self.log = log
        self.refusal_window = refusal_window
        self.drops: list[float] = []  # when drops were logged, for the per-minute burst
        self.unlogged = 0
        # Per address: [when its window began, refusals logged, refusals not logged].
        self.refusals: dict[str, list] = {}

    def dropped(self, text: str, now: float) -> None:
        self.drops = [t for t in self.drops if now - t < 60]
        if len(self.drops) < DROPS_LOGGED:
            if self.unlogged:
                text += f" ({self.unlogged} more not logged in the last minute)"
                self.unlogged = 0
            self.drops.append(now)
            self.log("warning", f"control port: {text}")
        else:
            self.unlogged += 1

    def refused(self, ip: str, text: str, now: float) -> None:
        if ip not in self.refusals and len(self.refusals) >= MAX_REFUSING:
            ip = "other addresses"
        entry = self.refusals.setdefault(ip, [now, 0, 0])
        if entry[1] < REFUSALS_LOGGED:
            entry[1] += 1
            self.log("warning", text)
        else:
            entry[2] += 1

    def summaries(self, now: float) -> None:
        """The refusals counted and not logged, per address whose window has ended."""
        for ip, (began, _, unlogged) in list(self.refusals.items()):
            if now - began >= self.refusal_window:
                del self.refusals[ip]
                if unlogged:
                    self.log(
                        "warning",
                        f"control port: {unlogged:,} more refused from {ip} in the last "
                        f"{self.refusal_window:g} s (not logged one by one)",
                    )
