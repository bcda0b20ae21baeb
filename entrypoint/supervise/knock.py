"""A new node 0 knocks at the lost node 0's address (the platform's MASTER_ADDR), where its
platform starts node 0 again: that node 0 knows no survivor's address, and on the job's own
etcd not even where etcd is (only the `go` it never got names its members). Heard through the
handshake (the job's token proven both ways), the knock tells it who holds node 0's seat, and it
joins that node 0 as a standby instead of serving a job nobody joins (coordinator/conductor.py,
`_knocked`; supervise/supervisor.py). From then on it keeps that address pointing at node 0
(`Pointer`), for any other node its platform starts again there."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from entrypoint.consensus.election import Holder
from entrypoint.control import control_channel, control_server
from entrypoint.control import messages as m
from entrypoint.control.actions import Action, Close, Log, Send
from entrypoint.control.identity import Identity
from entrypoint.control.node_fingerprint import Fingerprint

EVERY = 2.0  # seconds between knocks while nobody heard one
HEARD = 5.0  # seconds between knocks once one was heard (its own hello may have come later)
ANSWER = 3.0  # seconds a node 0 that took the knock has to answer and close


def holds_of(holder: Holder) -> str:
    """Node 0's seat as a knock and `Elsewhere` name it: "MEMBER HOST HOST:PORT"."""
    return f"{holder.member} {holder.host} {holder.address}"


class Knocker(threading.Thread):
    """Knocks at `address` (host, control port) every EVERY seconds until stopped; its hello
    carries this node's fingerprint (`fp`: a node 0's server reads every hello whole)."""

    def __init__(
        self, address: tuple[str, int], holder: Holder, identity: Identity, fp: Fingerprint
    ) -> None:
        super().__init__(name="entrypoint-knock", daemon=True)
        self.address, self.holder, self.identity, self.fp = address, holder, identity, fp
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        wait = EVERY
        while not self._halt.wait(wait):
            wait = HEARD if self.knock() else EVERY

    def knock(self) -> bool:
        """One knock: whether an entrypoint of this job serving there took it."""
        try:
            channel = control_channel.connect(
                *self.address,
                timeout=1.0,
                log=lambda _line: None,
                identity=self.identity,
                challenge_wait=2.0,
            )
        except Exception:  # nobody there (yet): the usual answer, never worth a line
            return False
        holder = self.holder
        try:
            channel.send(
                m.Hello(
                    member=holder.member,
                    host=holder.host,
                    fingerprint=self.fp,
                    time=time.time(),
                    holds=holds_of(holder),
                )
            )
            end = time.monotonic() + ANSWER
            while not channel.closed and time.monotonic() < end:
                channel.receive(0.2)
            return True
        except Exception:  # refused (another job's, another token): it is not ours to tell
            return False
        finally:
            channel.close()


class Pointer:
    """The mind of a control port that points at node 0 (control/actions.py's Mind): node 0
    started again and standing by keeps serving its port, the platform's node 0 address, so
    that any node its platform starts later, which joins that address, is told (through the
    handshake) which node holds node 0's seat, and joins that one. `holds` follows the seat
    (`moved`)."""

    def __init__(self, holds: str, expected: int) -> None:
        self.holds, self._expected = holds, expected

    def moved(self, holder: Holder) -> None:
        self.holds = holds_of(holder)

    @property
    def expected(self) -> int:
        return self._expected

    @property
    def ended(self) -> bool:
        return False

    def hello(self, member: int, message: m.Hello, now: float, wall_now: float) -> list[Action]:
        if message.holds:  # another knock: nothing to tell it
            return []
        holder, host, _ = self.holds.split()
        return [
            Log(
                "info",
                f"node {member} ({message.host}) joined at node 0's address: it is told that "
                f"node {holder} ({host}) holds node 0's seat",
            ),
            Send(member, m.Elsewhere(self.holds)),
            Close(member),
        ]

    def beat(self, member: int, message: m.Beat, now: float) -> list[Action]:
        return []

    def exited(self, member: int, message: m.Exit, now: float) -> list[Action]:
        return []

    def signalled(self, member: int, message: m.Signal, now: float) -> list[Action]:
        return []

    def stacks(self, member: int, message: m.Stacks, now: float) -> list[Action]:
        return []

    def health(self, member: int, message: m.Health, now: float) -> list[Action]:
        return []

    def closed(self, member: int, now: float) -> list[Action]:
        return []

    def tick(self, now: float) -> list[Action]:
        return []


def pointing(
    holds: str,
    expected: int,
    port: int,
    interval: float,
    log: Callable[[str, str], None],
    identity: Identity,
) -> tuple[Pointer, control_server.Server]:
    """Node 0's control port, serving a `Pointer` at `holds` (started)."""
    pointer = Pointer(holds, expected)
    server = control_server.Server(
        pointer, port, heartbeat_interval=interval, log=log, identity=identity
    )
    server.start()
    return pointer, server
