"""The supervising loop's small values: one launch as the loop sees it (`Watch`), the `NodeExit`
that ends this node with a code (`Node0Lost` when node 0 is lost), the `Interrupted` wait for
node 0, and the graces the workers get when the job ends elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

PEER_STOP_GRACE = 10.0  # seconds for workers to exit after another node failed
# After a lost node the workers hang in their next collective: no checkpoint can complete, so
# they get a moment to flush logs, then are killed (the 10 s bound from fault to exit); the
# same before a restart, whose cause (a lost node, a failed trainer) broke the collectives.
LOST_PEER_GRACE = 2.0
# A restart always follows broken collectives (a lost node, a failed or hung trainer, a node
# its platform restarted; a standby joins only at a restart): the old workers can neither
# checkpoint nor finish a step, so they are killed at once. Every second here is every GPU's.
RESTART_GRACE = 0.0


class NodeExit(Exception):
    """End this node with `code`; `reason` is logged unless empty (node 0's conductor has
    logged the reasons it sends)."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


class Node0Lost(NodeExit):
    """Node 0 is lost (its connection closed, or it went silent): the node ends with EXIT_PEERS,
    its running workers given LOST_PEER_GRACE first (entrypoint.supervise.supervisor), unless a
    survivor takes node 0's seat. `hung_up`: node 0's own host closed the connection (its
    process ended), which a cut network or a paused node 0 never does."""

    def __init__(self, code: int, reason: str = "", hung_up: bool = False) -> None:
        super().__init__(code, reason)
        self.hung_up = hung_up


class HeadElsewhere(Exception):
    """Node 0, started again by its platform, heard from its own server before its job formed:
    another node of the job holds node 0's seat (`holds`: "MEMBER HOST HOST:PORT"). It joins
    that one instead of serving a job of its own (entrypoint.supervise.supervisor)."""

    def __init__(self, holds: str) -> None:
        member, self.host, _ = holds.split()
        self.member, self.holds = int(member), holds
        super().__init__(holds)


class Interrupted(Exception):
    """A stopping signal while this node waits for node 0 (raised by the signal handler)."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


@dataclass
class Watch:
    """One launch as the supervising loop sees it."""

    signalled: int | None = None  # the stopping signal its workers were given
    signalled_at: float = 0.0
    kill_at: float | None = None  # when its workers are killed if still running
    code: int | None = None  # the launcher's exit status, once it exited
    reported: bool = False  # its exit was said to node 0

    def stopping(self, sig: int, now: float, grace: float) -> None:
        self.signalled, self.signalled_at, self.kill_at = sig, now, now + grace
