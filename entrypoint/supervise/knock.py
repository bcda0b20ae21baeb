"""A new node 0 knocks at the lost node 0's address (the platform's MASTER_ADDR), where its
platform starts node 0 again: that node 0 knows no survivor's address, and on the job's own
etcd not even where etcd is (only the `go` it never got names its members). Heard through the
handshake (the job's token proven both ways), the knock tells it who holds node 0's seat, and it
joins that node 0 as a standby instead of serving a job nobody joins (coordinator/conductor.py,
`_knocked`; supervise/supervisor.py)."""

from __future__ import annotations

import threading
import time

from entrypoint.consensus.election import Holder
from entrypoint.control import control_channel
from entrypoint.control import messages as m
from entrypoint.control.identity import Identity
from entrypoint.control.node_fingerprint import Fingerprint

EVERY = 2.0  # seconds between knocks while nobody heard one
HEARD = 5.0  # seconds between knocks once one was heard (its own hello may have come later)
ANSWER = 3.0  # seconds a node 0 that took the knock has to answer and close


class Knocker(threading.Thread):
    """Knocks at `address` (host, control port) every EVERY seconds until stopped; its hello
    carries this node's fingerprint (`fp`: a node 0's server reads every hello whole)."""

    def __init__(
        self, address: tuple[str, int], holder: Holder, identity: Identity, fp: Fingerprint
    ) -> None:
        super().__init__(name="entrypoint-knock", daemon=True)
        self.address, self.holder, self.identity, self.fp = address, holder, identity, fp
        self.heard = 0  # knocks a node 0 there took
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
                    holds=f"{holder.member} {holder.host} {holder.address}",
                )
            )
            end = time.monotonic() + ANSWER
            while not channel.closed and time.monotonic() < end:
                channel.receive(0.2)
            self.heard += 1
            return True
        except Exception:  # refused (another job's, another token): it is not ours to tell
            return False
        finally:
            channel.close()
