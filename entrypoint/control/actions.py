"""What node 0's mind returns and its server carries out: `Send`, `Log`, `Close`; and `Mind`, the
events the server feeds it. The server (entrypoint.control.control_server) knows the mind only
through this protocol; entrypoint.coordinator.conductor is the one there is, handed in by the
node (entrypoint.supervise.join)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from entrypoint.control.messages import Beat, Exit, Health, Hello, Message, Signal, Stacks

ALL = -1  # Send.to: every connected member


@dataclass(frozen=True)
class Send:
    to: int  # member id, or ALL
    message: Message


@dataclass(frozen=True)
class Log:
    level: str  # "info" | "warning" | "error"
    text: str


@dataclass(frozen=True)
class Close:
    member: int


# What every event of the mind returns, in order; the server carries them out.
Action = Send | Log | Close


class Mind(Protocol):
    """Node 0's decisions, one method per event: each takes the sender's member id (which the
    handshake proved), the typed message and `now` (the server's clock, monotonic seconds), and
    returns the actions to carry out in order. None raises."""

    @property
    def expected(self) -> int:
        """Members the platform started, spares included."""
        ...

    @property
    def ended(self) -> bool:
        """The job's end is decided (every node is being told)."""
        ...

    def hello(self, member: int, message: Hello, now: float, wall_now: float) -> list[Action]: ...
    def beat(self, member: int, message: Beat, now: float) -> list[Action]: ...
    def exited(self, member: int, message: Exit, now: float) -> list[Action]: ...
    def signalled(self, member: int, message: Signal, now: float) -> list[Action]: ...
    def stacks(self, member: int, message: Stacks, now: float) -> list[Action]: ...
    def health(self, member: int, message: Health, now: float) -> list[Action]: ...
    def closed(self, member: int, now: float) -> list[Action]: ...
    def tick(self, now: float) -> list[Action]: ...
