"""Time as a watcher of silence counts it: `time.monotonic()` less every stretch in which the
watching loop was itself held up (this process stopped or starved of CPU, or the whole machine
stalled: memory reclaim, a disk flushing gigabytes). A watcher hears nothing while it is held up
itself, so another's silence is counted only over time the watcher was awake to hear it: a stall
of its own is never taken for a silent peer (before: every process of a loaded machine held up
6 s at once, and node 0 named itself lost). A peer that dies meanwhile is named that much
later."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

KEPT = 600.0  # seconds of stalls remembered for `since`: far beyond any heartbeat timeout


class AwakeClock:
    """`round()` once a round of the watching loop; a round longer than `slack` (its wait and
    its work) was held up, and the excess is left out of `now()` and of `since()`."""

    def __init__(self, slack: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.slack, self.clock = slack, clock
        self.lost = 0.0  # seconds of stalls left out, in all
        self._last = clock()
        self._stalls: deque[tuple[float, float]] = deque()  # (when it ended, seconds left out)

    def round(self) -> float:
        """Called before what the round read is stamped. Returns now()."""
        raw = self.clock()
        excess = raw - self._last - self.slack
        self._last = raw
        if excess > 0:
            self.lost += excess
            self._stalls.append((raw, excess))
        while self._stalls and self._stalls[0][0] < raw - KEPT:
            self._stalls.popleft()
        return raw - self.lost

    def now(self) -> float:
        return self.clock() - self.lost

    def since(self, then: float) -> float:
        """Awake seconds since `then`, a `time.monotonic()` reading."""
        held = sum(excess for ended, excess in self._stalls if ended > then)
        return max(0.0, self.clock() - then - held)
