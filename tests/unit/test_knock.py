"""Node 0's port pointing at the node that holds its seat (supervise/knock.py's Pointer), as a
pure mind: what it tells a node that joins there. The knock itself, on real processes:
tests/unit/test_node0_takeover_real.py; both in node containers:
tests/cluster/test_node0_takeover.py."""

from __future__ import annotations

from fingerprints import fingerprint
from test_conductor import FP

from entrypoint.consensus.election import Holder
from entrypoint.control.actions import Close, Log, Send
from entrypoint.control.messages import Elsewhere, Hello
from entrypoint.supervise.knock import Pointer


def test_a_node_joining_node_0s_address_is_told_who_holds_the_seat_and_closed():
    pointer = Pointer("2 worker-2 worker-2:29501", expected=3)
    joining = Hello(1, "worker-1", 1000.0, fingerprint(FP))
    log, send, close = pointer.hello(1, joining, now=1.0, wall_now=1000.0)
    assert isinstance(log, Log) and "node 2 (worker-2) holds node 0's seat" in log.text
    assert (send, close) == (Send(1, Elsewhere("2 worker-2 worker-2:29501")), Close(1))
    pointer.moved(Holder(1, "worker-1", "worker-1:29501"))  # the seat moved on (a takeover)
    assert pointer.hello(2, joining, 2.0, 1000.0)[1] == Send(
        2, Elsewhere("1 worker-1 worker-1:29501")
    )
    knock = Hello(2, "worker-2", 1000.0, fingerprint(FP), holds="2 worker-2 worker-2:29501")
    assert pointer.hello(2, knock, 3.0, 1000.0) == []  # another knock: nothing to tell it
    assert pointer.tick(4.0) == [] and not pointer.ended and pointer.expected == 3
