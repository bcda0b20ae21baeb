"""A node's lease in etcd, kept alive, and the fence that stops its trainers before the lease
could end. etcd ends a lease no sooner than TTL seconds after it took the last renewal, and the
renewal was sent before etcd took it: so by this node's clock the lease surely lives until
(when the last answered renewal was sent) + TTL. A node that cannot renew stops its trainers
`margin` seconds before that instant, and only after the lease's end can another node take
what the lease held (node 0's seat, say). So two nodes 0 never train at once, whatever the
network does, as long as the two clocks run at about the same rate over a few seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from entrypoint.consensus.etcd import Etcd, EtcdError

# seconds: etcd's lease; a lost node 0's seat is free at most this long after its last renewal.
# Node 0 renews through etcd's own election of a new leader (another member paused or lost) as
# long as it takes under TTL - MARGIN (4.7 to 6 s). A 5 s lease (fenced 1 s before its end)
# fenced node 0 in CI's run while node 1, whose etcd member led, was paused (the suite beside
# it loading both cores); a 4 s one fenced a new node 0 while its 4 workers imported torch.
TTL = 8
MARGIN = 2.0  # seconds before the lease's surest end that a node that cannot renew fences itself
RETRY = 0.2  # seconds between renewals once one has failed
RENEWALS = 6  # renewals a lease's length: a failed one is tried again for most of the lease


def renew_at(sent: float, ttl: float) -> float:
    """When the next renewal goes: RENEWALS to a lease's length."""
    return sent + ttl / RENEWALS


def fence_at(valid_until: float, margin: float) -> float:
    """The instant a node that has not renewed since must have stopped its trainers."""
    return valid_until - margin


class LeaseKeeper:
    """Renews `lease` in a thread of its own. If it cannot be sure the lease lives `margin`
    seconds more (no renewal answered, or etcd says the lease is gone), it calls `fence(why)`
    once and stops renewing: the lease is as good as lost. The fence has a thread of its own,
    which waits on nothing but the clock: a renewal stuck where no timeout reaches (a name
    lookup on a node cut off from its network's DNS) never delays it."""

    def __init__(
        self,
        etcd: Etcd,
        lease: int,
        ttl: float,
        fence: Callable[[str], None],
        margin: float,
        asked_at: float,
        excused: Callable[[], str | None] | None = None,
    ) -> None:
        """asked_at: when the lease's grant was sent (time.monotonic() before it), not answered.
        excused: asked at the fence's instant when no renewal answered; a reason (nobody else
        can take what the lease holds: etcd's quorum is gone with its members' nodes) stops
        the keeper without the fence."""
        if not 0 < margin < ttl - ttl / RENEWALS:
            raise ValueError(
                f"a fence {margin} s before a {ttl} s lease's end leaves no time to renew"
            )
        self.etcd, self.lease, self.ttl, self.margin = etcd, lease, ttl, margin
        self._fence = fence
        self.valid_until = asked_at + ttl  # by this node's clock, the lease lives at least so long
        self._sent = asked_at  # when the last answered renewal was sent
        self.fenced: str | None = None  # why, once fenced
        self.excused: str | None = None  # why it stopped with no fence
        self._excused = excused
        self._once = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
        self._watch = threading.Thread(target=self._watch_clock, name="lease-fence", daemon=True)

    @classmethod
    def grant(
        cls,
        etcd: Etcd,
        ttl: int,
        fence: Callable[[str], None],
        margin: float = MARGIN,
        excused: Callable[[], str | None] | None = None,
    ) -> LeaseKeeper:
        """A new lease of ttl seconds, kept from now on."""
        asked = time.monotonic()
        return cls(etcd, etcd.grant(ttl), ttl, fence, margin, asked, excused).start()

    def start(self) -> LeaseKeeper:
        self._thread.start()
        self._watch.start()
        return self

    def stop(self, revoke: bool = False) -> None:
        """Stop renewing (and end the lease now, if revoke: what it holds is freed at once)."""
        self._stop.set()
        self._watch.join()
        self._thread.join(timeout=self.ttl)  # a renewal stuck in a lookup is left behind
        if revoke and self.fenced is None:
            try:
                self.etcd.revoke(self.lease)
            except EtcdError:
                pass  # it ends by itself within its TTL

    def _watch_clock(self) -> None:
        """The fence: at the instant the lease could be near its end with no renewal since."""
        while self.fenced is None:
            now = time.monotonic()
            deadline = fence_at(self.valid_until, self.margin)
            if now >= deadline:
                left = self.valid_until - now
                excused = self._excused() if self._excused is not None else None
                if excused is not None:
                    self.excused = excused
                    self._stop.set()
                    return
                return self._fenced(
                    f"no renewal of its etcd lease answered for "
                    f"{now - self._sent:.1f} s; it ends in {left:.1f} s at most"
                )
            if self._stop.wait(deadline - now):
                return

    def _run(self) -> None:
        tried, failed = self._sent, False
        while not self._stop.is_set() and self.fenced is None:
            deadline = fence_at(self.valid_until, self.margin)
            due = tried + RETRY if failed else renew_at(self._sent, self.ttl)
            if self._stop.wait(max(0.0, min(due, deadline) - time.monotonic())):
                return
            if self.fenced is not None or time.monotonic() >= deadline:
                return  # the fence's: judged by its own thread
            if time.monotonic() < due:
                continue
            tried = time.monotonic()
            try:  # tried no later than the fence: a renewal that answers after it is no use
                ttl = self.etcd.keepalive(self.lease, deadline=deadline)
            except EtcdError:
                failed = True
                continue
            if ttl <= 0:
                return self._fenced("etcd says its lease has ended")
            if self.fenced is None:
                self._sent, self.valid_until, failed = tried, tried + ttl, False

    def _fenced(self, why: str) -> None:
        with self._once:
            if self.fenced is not None or self._stop.is_set():
                return
            self.fenced = why
        self._stop.set()
        self._fence(why)
