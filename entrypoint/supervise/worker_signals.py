"""This node's signals on their way to the workers, those that start after them included."""

from __future__ import annotations

import collections
import signal
from typing import TYPE_CHECKING

from entrypoint import STOPPING, signal_name
from entrypoint.supervise import procs
from entrypoint.supervise.launcher_process import LauncherProcess

if TYPE_CHECKING:
    from entrypoint.supervise.logs import Logger

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class SignalRelay:
    """The signals this node received, and which workers of the current launch have each."""

    def __init__(self, log: Logger, grace_period: float) -> None:
        self.log, self.grace_period = log, grace_period
        # Filled by the signal handler in the main thread; emptied by the loop.
        self.received: collections.deque[int] = collections.deque()
        # Signals received while no worker existed (during the join, a restart, the
        # launcher's start): passed to the workers once they catch them.
        self.pending: list[int] = []
        self.delivered: dict[int, set[int]] = {}  # signal: the worker pids that have it
        self.told: set[int] = set()  # non-stopping signals said to node 0 in this launch

    def take(self) -> list[int]:
        taken = []
        while self.received:
            taken.append(self.received.popleft())
        return taken

    def new_launch(self) -> None:
        self.delivered, self.told = {}, set()

    def pass_on(self, launch: LauncherProcess, sig: int, why: str) -> list[int]:
        pids = launch.forward(sig) if launch.running() else []
        self.delivered.setdefault(sig, set()).update(pids)
        grace = (
            f"; they have {self.grace_period:g} s (ENTRYPOINT_GRACE_PERIOD) to checkpoint and exit"
            if sig in STOPPING
            else ""
        )
        later = "" if pids else "; passed to the workers as they start"
        self.log.warning(f"{why}: forwarded to {len(pids)} worker process(es){grace}{later}")
        return pids

    def deliver_late(
        self, launch: LauncherProcess, signalled: int | None, signalled_at: float, now: float
    ) -> list[int]:
        """Workers that started after a signal arrived get it too: as soon as they catch it
        (their handler is installed), or a stopping signal once 3/4 of the grace period are
        spent even if they never do (its default action ends them). Returns the signals to
        say to node 0 now."""
        wanted = ([signalled] if signalled is not None else []) + self.pending
        if not wanted or not launch.running():
            return []
        workers = launch.workers()
        if not workers:
            return []
        patience, tell = self.grace_period * 0.75, []
        for sig in wanted:
            got = self.delivered.setdefault(sig, set())
            new = [
                pid
                for pid in workers
                if pid not in got
                and (
                    procs.catches(pid, sig) or (sig == signalled and now - signalled_at > patience)
                )
            ]
            if not new:
                continue
            procs.send(new, sig)
            got.update(new)
            self.log.warning(
                f"{signal_name(sig)} reached {len(new)} worker(s) that started after it arrived"
            )
            if sig != signalled and sig not in self.told:
                self.told.add(sig)
                tell.append(sig)
        if self.pending and all(
            len(self.delivered.get(sig, ())) >= len(workers) for sig in self.pending
        ):
            self.pending = []
        return tell

    def drop_pending(self) -> None:
        """The launch ended: say which signals no worker caught, and forget them."""
        if self.pending:
            self.log.warning(
                "no worker caught "
                + ", ".join(signal_name(s) for s in self.pending)
                + " before the trainer ended"
            )
            self.pending = []
