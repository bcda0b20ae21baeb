"""Fuzzing the control channel (issue 17): whatever arrives, node 0's server never stops and
the job goes on. Hypothesis sends random bytes, JSON of every wrong type, valid hellos with a
field broken or missing, truncated and huge lines, in random pieces, and floods of connections
to a real Server on loopback (with a job token, so that nothing random can pass for a node);
after every example the server must still be running and answer a new connection with its
challenge, and at the end the real nodes join and get `go`."""

from __future__ import annotations

import json
import socket
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from entrypoint.control import control_channel, control_server
from entrypoint.control import messages as m
from entrypoint.control.identity import Identity
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.state import Limits
from tests.unit.test_control import TOKEN, goes, hello, typed

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)
KINDS = st.sampled_from(sorted(m.KINDS) + ["", "HELLO", None, 1])
WIRE_HELLO = hello(1) | {
    "protocol": m.PROTOCOL,
    "job": "",
    "auth": m.AUTH_HMAC,
    "nonce": "1" * 32,
    "proof": "2" * 64,
}


@st.composite
def broken_hello(draw) -> bytes:
    """A real hello with one field replaced by anything, or removed, at any depth."""
    wire = json.loads(json.dumps(WIRE_HELLO))
    where = draw(st.sampled_from([wire, wire["fingerprint"], wire["fingerprint"]["layout"]]))
    key = draw(st.sampled_from(sorted(where)))
    if draw(st.booleans()):
        del where[key]
    else:
        where[key] = draw(JSON)
    return json.dumps(wire).encode() + b"\n"


@st.composite
def some_json(draw) -> bytes:
    value = draw(JSON)
    if draw(st.booleans()):
        value = {"t": draw(KINDS), **(value if isinstance(value, dict) else {"x": value})}
    return json.dumps(value).encode() + b"\n"


@st.composite
def truncated(draw) -> bytes:
    line = json.dumps(WIRE_HELLO).encode()
    return line[: draw(st.integers(0, len(line) - 1))]


HUGE = st.integers(1, 3).map(lambda k: b"{" + b'"a":' * (k * (m.MAX_LINE // 8)))
PAYLOAD = st.lists(
    st.binary(max_size=300) | some_json() | broken_hello() | truncated() | HUGE,
    min_size=1,
    max_size=4,
).map(b"".join)


class Fuzzed:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.conductor = Conductor(
            2, Limits(join_timeout=600, heartbeat_timeout=600, monitor_interval=0), time.monotonic()
        )
        self.server = control_server.Server(
            self.conductor,
            0,
            heartbeat_interval=0.5,
            bind="127.0.0.1",
            identity=Identity("", TOKEN),
            log=lambda level, text: self.lines.append(text),
            max_pending=32,
        )
        self.server.start()

    def answers(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as sock:
            return json.loads(sock.recv(4096).split(b"\n")[0])["t"] == "challenge"


def test_nothing_a_peer_sends_stops_node_0():
    node0 = Fuzzed()

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(payload=PAYLOAD, pieces=st.integers(1, 7), close=st.booleans(), flood=st.integers(0, 40))
    def example(payload: bytes, pieces: int, close: bool, flood: int) -> None:
        held = [socket.create_connection(("127.0.0.1", node0.server.port)) for _ in range(flood)]
        sock = socket.create_connection(("127.0.0.1", node0.server.port))
        try:
            step = max(1, len(payload) // pieces)
            for i in range(0, len(payload), step):
                sock.sendall(payload[i : i + step])
        except OSError:
            pass  # node 0 dropped it: what it should do
        if close:
            sock.close()
        for extra in held:
            extra.close()
        assert node0.server.is_alive() and node0.answers()
        assert node0.conductor.job.phase == "join" and not node0.conductor.job.members
        sock.close()

    example()
    assert any("dropped a connection from 127.0.0.1:" in line for line in node0.lines)
    identity = Identity("", TOKEN)
    nodes = []
    for member in (0, 1):
        channel = control_channel.connect(
            "127.0.0.1", node0.server.port, timeout=10, log=print, identity=identity
        )
        channel.send(typed(hello(member)))
        nodes.append(channel)
    goes(*nodes)
    assert node0.conductor.job.phase == "run"
    node0.server.stop()
    node0.server.join(timeout=5)


@settings(max_examples=500, deadline=None)
@given(line=st.binary(max_size=400) | some_json() | broken_hello() | truncated())
def test_decode_raises_only_bad_message(line):
    """The one decoder turns any line into a typed message or BadMessage, nothing else."""
    try:
        message = m.decode(line.rstrip(b"\n"), m.FROM_NODES | m.FROM_NODE_0)
    except m.BadMessage:
        return
    assert m.decode(m.encode(message).rstrip(b"\n"), m.FROM_NODES | m.FROM_NODE_0) == message
