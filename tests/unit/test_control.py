"""The control channel as an outsider meets it (issue 17): node 0's real Server on loopback,
real sockets, a real Conductor. Garbage, wrong types, oversized lines, silent and surplus
connections, strangers, other jobs and wrong tokens are dropped or refused with their address,
and the job goes on: a real node still joins and gets `go`. The fuzz tests are in
test_control_fuzz.py, the messages' schema in test_messages.py."""

from __future__ import annotations

import json
import selectors
import socket
import struct
import threading
import time

import pytest

from entrypoint.control import control_channel, control_server, transport
from entrypoint.control import messages as m
from entrypoint.control.identity import Identity
from entrypoint.control.node_fingerprint import Fingerprint
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.state import Limits

FP = {
    "image_lock": "abc",
    "image_revision": "r1",
    "python": "3.13.5",
    "torch": "2.10.0",
    "jax": "0.12.0.1",
    "deepspeed": "0.19.8",
    "nccl": "2.27.5",
    "cuda_driver": None,
    "gpu_model": "none",
    "gpus_per_node": 0,
    "packages": {"torch": "2.10.0"},
    "data": None,
    "layout": {
        "nnodes": 2,
        "node_rank": 0,
        "spares": 0,
        "min_nodes": 2,
        "nproc_per_node": 2,
        "world_size": 4,
        "master_addr": "node-0",
        "master_port": 29500,
        "launcher": "torchrun",
    },
}
TOKEN = b"0123456789abcdef0123456789abcdef"


def hello(member: int, **fields) -> dict:
    fp = json.loads(json.dumps(FP))
    fp["layout"]["node_rank"] = member
    return {
        "t": "hello",
        "member": member,
        "node_rank": member,
        "host": f"node-{member}",
        "generation": 0,
        "time": time.time(),
        "fingerprint": fp,
    } | fields


def typed(raw: dict) -> m.Message:
    """A message given in its wire form, as the channel takes it (a hello's fingerprint checked
    as node 0 checks it)."""
    fields = {k: v for k, v in raw.items() if k != "t"}
    if "fingerprint" in fields:
        fields["fingerprint"] = Fingerprint.from_wire(fields["fingerprint"])
    return m.KINDS[raw["t"]](**fields)


class Node0:
    """A Server and its Conductor for `expected` nodes; what it logged."""

    def __init__(
        self, expected: int = 2, identity: Identity = transport.NO_IDENTITY, **kwargs
    ) -> None:
        self.lines: list[tuple[str, str]] = []
        self.conductor = Conductor(
            expected,
            Limits(join_timeout=60, heartbeat_timeout=30, monitor_interval=0),
            time.monotonic(),
        )
        self.server = control_server.Server(
            self.conductor,
            0,
            heartbeat_interval=0.5,
            bind="127.0.0.1",
            log=lambda level, text: self.lines.append((level, text)),
            identity=identity,
            **kwargs,
        )
        self.server.start()
        self.port = self.server.port

    def logged(self, text: str, timeout: float = 5.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [line for _, line in list(self.lines) if text in line]
            if found:
                return found[0]
            time.sleep(0.02)
        raise AssertionError(f"{text!r} not logged; logged: {self.lines}")

    def node(
        self, member: int, identity: Identity = transport.NO_IDENTITY
    ) -> control_channel.Channel:
        channel = control_channel.connect(
            "127.0.0.1", self.port, timeout=10, log=print, identity=identity
        )
        channel.send(typed(hello(member)))
        return channel

    def close(self) -> None:
        self.server.stop()
        self.server.join(timeout=5)  # Thread.join: no TypeError (Server._stop shadowed it)
        assert not self.server.is_alive()


@pytest.fixture
def node0():
    made: list[Node0] = []

    def make(*args, **kwargs) -> Node0:
        made.append(Node0(*args, **kwargs))
        return made[-1]

    yield make
    for server in made:
        server.close()


def test_the_server_shadows_nothing_of_threading_thread(node0):
    """`Server._stop` hid Thread._stop (join() raised TypeError on 3.11); Python 3.13 added
    Thread._handle. No name of the Server's may be one of Thread's, in any version here."""
    n = node0()
    thread = threading.Thread()
    theirs = set(dir(threading.Thread)) | set(vars(thread))
    ours = (set(vars(control_server.Server)) | set(vars(n.server)) - set(vars(thread))) - {
        "__init__",
        "__module__",
        "__doc__",
        "run",
    }
    assert not ours & theirs, ours & theirs


def raw(port: int) -> socket.socket:
    """A stranger's connection, the challenge read."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    assert json.loads(sock.recv(4096).split(b"\n")[0])["t"] == "challenge"
    return sock


def until(predicate, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


def join(n: Node0) -> list[control_channel.Channel]:
    """Both real nodes join and get `go`: the job went on."""
    channels = [n.node(0), n.node(1)]
    goes(*channels)
    assert n.conductor.job.phase == "run" and n.server.is_alive()
    return channels


def goes(*channels: control_channel.Channel, timeout: float = 5.0) -> None:
    """Every channel receives `go`."""
    for channel in channels:
        end = time.monotonic() + timeout
        while not any(msg.kind == "go" for msg in channel.receive(0.2)):
            assert time.monotonic() < end and not channel.closed, "no go"


def test_one_stray_line_is_dropped_with_its_address_and_the_job_goes_on(node0):
    n = node0()
    sock = raw(n.port)
    sock.sendall(b"1\n")
    line = n.logged("dropped a connection from 127.0.0.1:")
    assert "a message is a JSON object, got int" in line
    assert sock.recv(100) == b""  # closed
    join(n)


WIRE = {"protocol": m.PROTOCOL, "job": "", "auth": "none", "nonce": "1" * 32, "proof": ""}


@pytest.mark.parametrize(
    "line, why",
    [
        (b'{"t":"hello","member":"x"}', "protocol missing"),
        (
            json.dumps(hello(1) | WIRE | {"member": "1"}).encode(),
            ("member must be an integer 0-1048576, got '1'"),
        ),
        (json.dumps(hello(1) | WIRE | {"member": True}).encode(), "member must be an integer"),
        (json.dumps(hello(1) | WIRE | {"time": "now"}).encode(), "time must be a finite number"),
        (
            json.dumps(hello(1) | WIRE).replace('"time": ', '"time": NaN, "x": ').encode(),
            "NaN is not a number JSON allows",
        ),
        (json.dumps(hello(1) | WIRE | {"fingerprint": {}}).encode(), "image_lock missing"),
        (
            json.dumps(hello(1) | WIRE | {"fingerprint": FP | {"layout": {}}}).encode(),
            "nnodes missing",
        ),
        (
            json.dumps(hello(1) | WIRE | {"fingerprint": FP | {"packages": None}}).encode(),
            "fingerprint.packages must map",
        ),
        (json.dumps(hello(1) | WIRE | {"auth": "plain"}).encode(), "auth must be none or"),
        (b'{"t":"exit","code":0,"signal":128}', "signal must be an integer 1-127, got 128"),
        (b'{"t":"exit","code":0,"signal":15}', "sent exit before its hello"),
        (b'{"t":"beat"}', "sent beat before its hello"),
        (b'{"t":"go"}', "unknown message type 'go'"),
        (b"\xff\xfe garbage", "not JSON"),
        (b"[" * 100_000, "not JSON (RecursionError)"),
        (b'"hello"', "a message is a JSON object, got str"),
    ],
)
def test_a_stranger_gets_nothing_from_a_bad_first_line(node0, line, why):
    n = node0()
    sock = raw(n.port)
    sock.sendall(line + b"\n")
    assert n.logged(why).startswith("control port: dropped a connection from 127.0.0.1:")
    sock.settimeout(5)
    assert sock.recv(100) == b""  # closed
    join(n)


def test_a_members_bad_line_is_skipped_not_trusted(node0):
    """An exit code of 256 or an unknown signal from a member is never acted on: the forged
    `{"t":"exit","code":0,"signal":128}` of issue 17 no longer ends the job with 'exit 256'."""
    n = node0()
    a, b = n.node(0), n.node(1)
    goes(a, b)
    a.sock.sendall(b'{"t":"exit","code":0,"signal":128}\n{"t":"exit","code":256}\n')
    n.logged("skipped a line from node 0 (node-0, 127.0.0.1:")
    n.logged("code must be an integer 0-255")
    assert n.conductor.job.phase == "run" and n.conductor.job.outcome is None


def test_an_oversized_line_is_dropped(node0):
    n = node0()
    sock = raw(n.port)
    chunk = b"x" * 65536
    try:
        for _ in range((m.MAX_LINE // len(chunk)) + 2):
            sock.sendall(chunk)
    except OSError:
        pass  # node 0 closed it mid-way
    n.logged(f"a line of more than {m.MAX_LINE} bytes")
    join(n)


def test_a_silent_connection_is_dropped_after_the_hello_timeout(node0):
    n = node0(hello_timeout=0.5)
    sock = raw(n.port)
    assert "no hello within 0.5 s" in n.logged("dropped a connection from 127.0.0.1:")
    sock.settimeout(5)
    assert sock.recv(100) == b""
    join(n)


def test_a_flood_of_connections_cannot_lock_a_node_out(node0):
    """More strangers than places for connections not yet through the handshake: the oldest
    goes, the drops are logged at most 20 a minute, and the real nodes still join."""
    n = node0(max_pending=8)
    strangers = [raw(n.port) for _ in range(40)]
    n.logged("more than 8 connections waiting for their hello")
    join(n)
    dropped = [t for _, t in n.lines if "connections waiting" in t]
    assert len(dropped) == 20  # 34 dropped: 20 lines a minute, no more
    for sock in strangers:
        sock.close()


def test_partial_writes_keep_the_stream_whole_and_a_stuck_peer_is_dropped(monkeypatch):
    """Writes never block node 0: what the socket does not take waits, in order, in the
    peer's own buffer (no corrupted stream after a partial write); a peer that takes nothing
    is dropped once MAX_OUT bytes wait for it."""
    logged: list[str] = []
    server = control_server.Server(
        Conductor(2, Limits(), time.monotonic()),
        0,
        heartbeat_interval=1,
        bind="127.0.0.1",
        log=lambda level, text: logged.append(text),
    )
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    peer = control_server.Peer(ours, "127.0.0.1:1", time.monotonic())
    server.peers[ours] = peer
    server.selector.register(ours, selectors.EVENT_READ, None)
    sent = [m.encode(m.Signal(10, str(i) * 1000)) for i in range(1000)]  # 3 MB
    began = time.monotonic()
    for data in sent:
        server._queue(peer, data)
    assert time.monotonic() - began < 5 and peer.out  # nothing blocked; the kernel took part
    received = bytearray()
    while len(received) < sum(map(len, sent)):
        try:
            received += theirs.recv(1 << 20)
        except BlockingIOError:
            server._flush(peer)
    assert bytes(received) == b"".join(sent)
    monkeypatch.setattr(control_server, "MAX_OUT", 64 << 10)
    for data in sent:
        server._queue(peer, data)
        if ours not in server.peers:
            break
    assert ours not in server.peers
    assert any("dropped a connection from 127.0.0.1:1: it has not read" in t for t in logged)
    server.selector.close()
    server.listener.close()
    theirs.close()


def test_job_identity_and_token_checked_both_ways(node0):
    """A node of another job, a node without the token, a wrong token: refused with one line
    on both sides naming the node and the reason; node 0 goes on, the right nodes join."""
    me = Identity("SLURM_JOB_ID=7", TOKEN)
    n = node0(identity=me)
    cases = [
        (
            Identity("SLURM_JOB_ID=6", TOKEN),
            ("it belongs to another job: SLURM_JOB_ID=6 there, SLURM_JOB_ID=7 on node 0"),
        ),
        (
            Identity("SLURM_JOB_ID=7"),
            ("node 0 has a job token (ENTRYPOINT_JOB_TOKEN), it has none"),
        ),
        (Identity("SLURM_JOB_ID=7", b"x" * 32), "wrong job token"),
    ]
    for identity, why in cases:
        channel = n.node(1, identity)
        with pytest.raises(transport.Refused) as refused:
            while True:
                channel.receive(1.0)
        assert str(refused.value).startswith("node 0 refused node 1 (node-1, 127.0.0.1:")
        assert why in str(refused.value)
        assert (
            f"refused node 1 (node-1, 127.0.0.1:{channel.sock.getsockname()[1]}): {why}"
            in n.logged(why)
        )
        assert TOKEN.decode() not in json.dumps(n.lines)
    good = [n.node(0, me), n.node(1, me)]
    goes(*good)
    assert all(c.welcomed for c in good)


def test_a_node_0_without_the_token_cannot_pass_as_node_0(node0):
    """The node checks node 0 too: a node 0 that says it uses no token gets no hello (and no
    proof) from a node that holds one; the node stops, exit 2, naming both ends."""
    n = node0(identity=Identity("", None))
    with pytest.raises(transport.Refused) as refused:
        control_channel.connect(
            "127.0.0.1", n.port, timeout=5, log=print, identity=Identity("", TOKEN)
        )
    assert refused.value.exit_code == 2
    assert str(refused.value) == (
        f"node 0 at 127.0.0.1:{n.port} runs without a job token, this node has one "
        "(ENTRYPOINT_JOB_TOKEN): give every node the same token, or none"
    )


def fake_node0(*lines: m.Message, auth: str = m.AUTH_HMAC, pause: float = 0.2):
    """A listener that answers like node 0 without the token: its challenge (`auth`), then
    `lines` once a hello came (each after `pause`). Returns its port and what it received."""
    listener = socket.create_server(("127.0.0.1", 0))
    got = bytearray()

    def serve():
        conn, _ = listener.accept()
        conn.sendall(m.encode(m.Challenge("a" * 32, "", auth)))
        conn.settimeout(3)
        try:
            got.extend(conn.recv(65536))
            for line in lines:
                time.sleep(pause)
                conn.sendall(m.encode(line))
            time.sleep(3)
        except OSError:
            pass
        conn.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], got


def test_go_without_node_0s_proof_is_refused_by_a_node_with_a_token():
    """An impostor node 0 that skips the welcome: its `go` and `stop` are never acted on; the
    node stops, exit 2, naming node 0's address."""
    port, _ = fake_node0(m.Go(), m.Stop(0, "done"))
    channel = control_channel.connect(
        "127.0.0.1", port, timeout=5, log=print, identity=Identity("", TOKEN)
    )
    channel.send(typed(hello(1)))
    got: list[m.Message] = []
    with pytest.raises(transport.Refused) as refused:
        end = time.monotonic() + 5
        while time.monotonic() < end:
            got += channel.receive(0.5)
    assert got == []
    assert refused.value.exit_code == 2
    assert f"node 0 at 127.0.0.1:{port} sent go before proving" in str(refused.value)
    assert not channel.welcomed


def test_a_welcome_with_no_proof_is_refused_by_a_node_with_a_token():
    port, _ = fake_node0(m.Welcome(""), m.Go())
    channel = control_channel.connect(
        "127.0.0.1", port, timeout=5, log=print, identity=Identity("", TOKEN)
    )
    channel.send(typed(hello(1)))
    with pytest.raises(transport.Refused, match="could not prove that it holds"):
        end = time.monotonic() + 5
        while time.monotonic() < end:
            assert channel.receive(0.5) == []


def test_a_node_with_a_token_sends_no_proof_to_a_challenge_without_one():
    port, got = fake_node0(auth=m.AUTH_NONE)
    with pytest.raises(transport.Refused, match="runs without a job token, this node has one"):
        control_channel.connect(
            "127.0.0.1", port, timeout=5, log=print, identity=Identity("", TOKEN)
        )
    time.sleep(0.5)
    assert bytes(got) == b""


def test_a_forged_welcome_is_refused_by_the_node():
    """A listener that answers like node 0 without the token: the node stops, exit 2."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def fake():
        conn, _ = listener.accept()
        conn.sendall(m.encode(m.Challenge("a" * 32, "", m.AUTH_HMAC)))
        conn.recv(65536)
        conn.sendall(m.encode(m.Welcome("b" * 64)))
        time.sleep(1)
        conn.close()

    threading.Thread(target=fake, daemon=True).start()
    channel = control_channel.connect(
        "127.0.0.1", port, timeout=5, log=print, identity=Identity("", TOKEN)
    )
    channel.send(typed(hello(1)))
    with pytest.raises(transport.Refused, match="could not prove that it holds") as refused:
        while True:
            channel.receive(1.0)
    assert refused.value.exit_code == 2
    listener.close()


def test_something_else_on_the_port_is_named():
    listener = socket.create_server(("127.0.0.1", 0))

    def http():
        conn, _ = listener.accept()
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        time.sleep(2)

    threading.Thread(target=http, daemon=True).start()
    with pytest.raises(transport.PeersError, match="is not node 0's entrypoint"):
        control_channel.connect(
            "127.0.0.1", listener.getsockname()[1], timeout=5, log=print, challenge_wait=1
        )
    listener.close()


def test_lines_split_once_however_the_bytes_arrive():
    """4 MiB of lines in 1460-byte pieces: every line comes out once, in order, each byte
    looked at once (issue 17: re-splitting the buffer cost 6.9 s of CPU)."""
    lines = transport.Lines(limit=1 << 20)
    payload = b"".join(b'{"t":"beat","n":%d}\n' % i for i in range(200_000))
    out: list[bytes] = []
    began = time.process_time()
    for i in range(0, len(payload), 1460):
        out += lines.feed(payload[i : i + 1460])
    spent = time.process_time() - began
    assert len(out) == 200_000 and out[-1] == b'{"t":"beat","n":199999}'
    print(f"MEASURED {len(payload) >> 20} MiB in 1460-byte pieces: {spent:.2f} s of CPU")
    one, began = transport.Lines(limit=8 << 20), time.process_time()
    for i in range(0, 4 << 20, 1460):  # one 4 MiB line, no newline yet: 4.35 s before
        assert one.feed(b"x" * 1460) == []
    print(f"MEASURED one 4 MiB line in 1460-byte pieces: {time.process_time() - began:.2f} s")
    with pytest.raises(ValueError, match="more than 16 bytes"):
        transport.Lines(limit=16).feed(b"x" * 17)


def test_the_layout_is_compared_and_the_odd_node_named(node0):
    """Node 0 with WORLD_SIZE=2 nodes, node 1 with ENTRYPOINT_NNODES=4 (issue 17): both stop
    with exit 2 before training, node 1 and the fields named."""
    for stop in _both_stopped(node0(), {"nnodes": 4, "world_size": 8}):
        assert stop.code == 2
        assert (
            "node 1 (node-1) plans another job shape: nnodes 4 vs 2 on node 0 (node-0); "
            "world_size 8 vs 4"
        ) in stop.reason


def _both_stopped(n: "Node0", layout: dict) -> list[m.Stop]:
    """Node 0 and node 1, whose hello plans `layout` over node 0's: the stop each receives."""
    a = n.node(0)
    b = control_channel.connect("127.0.0.1", n.port, timeout=5, log=print)
    shape = hello(1)
    shape["fingerprint"]["layout"] |= layout
    b.send(typed(shape))
    got = []
    for channel in (a, b):
        end = time.monotonic() + 5
        stops: list[m.Stop] = []
        while not stops:
            stops = [msg for msg in channel.receive(0.2) if isinstance(msg, m.Stop)]
            assert time.monotonic() < end
        got.append(stops[0])
    return got


def test_a_node_that_plans_other_spares_is_named_over_the_wire(node0):
    """A hello's layout carries the node's ENTRYPOINT_SPARES and ENTRYPOINT_MIN_NODES, and the
    wire check keeps them (it kept 7 of the layout's 9 fields: node 0 compared them only in unit
    tests that skipped the wire, and two nodes planning other spares would have gone on)."""
    for stop in _both_stopped(node0(), {"spares": 1, "min_nodes": 1}):
        assert stop.code == 2
        assert (
            "node 1 (node-1) plans another job shape: spares 1 vs 0 on node 0 (node-0); "
            "min_nodes 1 vs 2"
        ) in stop.reason, stop.reason


FAKE = "evil\n2026-11-25T03:00:00Z [error    ] node 0: stopping the job\x1b[2K\r\x1b]0;x\x07"


def test_a_strangers_host_and_job_cannot_write_fake_log_lines(node0):
    """An unauthenticated hello's host and job, with newlines and escape codes, are logged
    escaped and bounded, on one line naming the stranger's address (issue 28)."""
    n = node0(identity=Identity("SLURM_JOB_ID=7"))
    sock = raw(n.port)
    sock.sendall(
        m.encode(
            m.Hello(1, FAKE * 3, Fingerprint.from_wire(FP), time.time(), job=FAKE, nonce="c" * 32)
        )
    )
    line = n.logged("refused node 1")
    port = sock.getsockname()[1]
    assert not any(c in line for c in "\n\r\x1b\x07"), line
    assert f", 127.0.0.1:{port}): it belongs to another job: 'evil\\n2026" in line
    assert len(line) < 400
    reply = json.loads(sock.recv(65536).split(b"\n")[0])
    assert reply["t"] == "refuse" and "\n" not in reply["reason"]
    sock.close()


def test_a_member_with_a_hostile_host_is_named_escaped(node0):
    """No token, same job: the hello passes, and every later line about the node names its
    host escaped (here: two nodes claiming one rank)."""
    n = node0()
    first = n.node(1)
    until(lambda: 1 in n.server.members)
    sock = raw(n.port)
    sock.sendall(m.encode(m.Hello(1, FAKE, Fingerprint.from_wire(FP), time.time(), nonce="c" * 32)))
    line = n.logged("claimed by both")
    assert not any(c in line for c in "\n\r\x1b\x07"), line
    assert "'evil\\n2026" in line
    first.close()
    sock.close()


def test_a_refusal_from_an_unproven_node_0_is_logged_escaped():
    port, _ = fake_node0(m.Refuse(FAKE))
    channel = control_channel.connect("127.0.0.1", port, timeout=5, log=print)
    channel.send(typed(hello(1)))
    with pytest.raises(transport.Refused) as refused:
        end = time.monotonic() + 5
        while time.monotonic() < end:
            channel.receive(0.5)
    assert str(refused.value).startswith("'evil\\n2026")
    assert not any(c in str(refused.value) for c in "\n\r\x1b\x07")


def test_refusals_are_logged_a_few_per_address_then_counted(node0):
    """Issue 28: a flood of hellos from one address (30,000 refusal lines in 8 s before):
    at most 5 refusal lines per address per window, then one line with how many more; every
    stranger is still refused, and real nodes still join."""
    window = 3.0
    n = node0(identity=Identity("SLURM_JOB_ID=7"), refusal_window=window)
    began = time.monotonic()
    sent = 0
    for _ in range(4):
        socks = [raw(n.port) for _ in range(50)]
        for sock in socks:
            sock.sendall(
                m.encode(
                    m.Hello(1, "x", Fingerprint.from_wire(FP), time.time(), job="J", nonce="c" * 32)
                )
            )
        for sock in socks:
            assert json.loads(sock.recv(65536).split(b"\n")[0])["t"] == "refuse"
            sock.close()
        sent += len(socks)
    took = time.monotonic() - began
    summary = n.logged("more refused from 127.0.0.1 in the last 3 s", timeout=window + 3)
    time.sleep(max(0.0, began + took + window + 1 - time.monotonic()))  # every window said
    lines = [t for _, t in n.lines if t.startswith("refused node 1")]
    windows = int(took // window) + 1
    assert 5 <= len(lines) <= 5 * windows, (len(lines), took)
    counted = sum(
        int(t.split(" more refused")[0].rsplit(" ", 1)[1].replace(",", ""))
        for _, t in n.lines
        if " more refused from " in t
    )
    assert len(lines) + counted == sent, (len(lines), counted, summary)
    good = [n.node(0, Identity("SLURM_JOB_ID=7")), n.node(1, Identity("SLURM_JOB_ID=7"))]
    goes(*good)


class Unstarted:
    """Node 0's Server, not started: the test runs its rounds (`_accept`) by hand, so that
    what arrives between two rounds is exactly what a flood makes of it."""

    def __init__(self, max_pending: int) -> None:
        self.lines: list[str] = []
        self.server = control_server.Server(
            Conductor(2, Limits(join_timeout=60, heartbeat_timeout=30), time.monotonic()),
            0,
            heartbeat_interval=1,
            bind="0.0.0.0",
            log=lambda level, text: self.lines.append(text),
            max_pending=max_pending,
        )
        self.socks: list[socket.socket] = []

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        sock = socket.socket()
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", self.server.port))
        self.socks.append(sock)
        return sock

    def node(self, member: int) -> control_channel.Channel:
        """A real node's connect, its challenge taken and its hello sent (not yet read)."""
        got: list[control_channel.Channel] = []
        thread = threading.Thread(
            target=lambda: got.append(
                control_channel.connect("127.0.0.1", self.server.port, timeout=5, log=print)
            )
        )
        thread.start()
        until(lambda: self.server._accept() or bool(self.server.peers))
        thread.join(5)
        got[0].send(typed(hello(member)))
        time.sleep(0.2)  # its hello waits in node 0's socket, unread
        return got[0]

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        for peer in list(self.server.peers.values()):
            self.server._drop(peer)
        self.server.selector.close()
        self.server.listener.close()


def welcomed(channel: control_channel.Channel) -> bool:
    end = time.monotonic() + 5
    while not channel.welcomed and not channel.closed and time.monotonic() < end:
        channel.receive(0.1)
    return channel.welcomed


def test_a_hello_waiting_unread_survives_a_flood_from_its_own_address():
    """Issue 28: under a flood, pending connections were dropped oldest first before their
    hello was read (node 1 joined in 4 of 8 trials). The oldest now gives way only once what
    it sent is read: a real node's hello, there before the flood, is served."""
    s = Unstarted(max_pending=8)
    try:
        channel = s.node(1)
        for _ in range(20):  # strangers from the node's own address, all in one round
            s.connect()
        s.server._accept()
        assert welcomed(channel), s.lines
        assert 1 in s.server.members and len(s.server.pending) <= 8
        assert any("more than 8 connections waiting for their hello" in t for t in s.lines)
    finally:
        s.close()


def test_a_flood_from_one_address_pushes_out_its_own_connections_first():
    """Issue 28: the busiest address gives way first: 20 strangers from 127.0.0.2 leave
    a connection from 127.0.0.1 that has not said hello yet in place, and it joins."""
    s = Unstarted(max_pending=8)
    try:
        node = s.connect("127.0.0.1")
        s.server._accept()
        for _ in range(20):
            s.connect("127.0.0.2")
        s.server._accept()
        dropped = [t for t in s.lines if "more than 8 connections waiting" in t]
        assert dropped and all("(the most from 127.0.0.2)" in t for t in dropped), s.lines
        node.settimeout(5)
        assert json.loads(node.recv(4096).split(b"\n")[0])["t"] == "challenge"
        node.settimeout(0.3)
        with pytest.raises(TimeoutError):  # still open: not dropped (that reads b"")
            node.recv(4096)
    finally:
        s.close()


def test_a_node_tries_node_0_every_tenth_of_a_second_while_the_nodes_start():
    """Issue 22: a node started with node 0 retried after 0.25, 0.5 and 1 s, so a node 0 that
    listened 0.3 s late cost every node up to 0.45 s more; now every 0.1 s for 5 s."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once closed
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    with pytest.raises(transport.PeersError):
        control_channel.connect("127.0.0.1", port, timeout=1.0, log=lambda _: None, sleep=sleep)
    assert len(slept) >= 5 and all(d <= control_channel.QUICK_RETRY for d in slept), slept


def test_the_join_timeout_named_is_the_setting_not_the_time_left():
    """CI, 2026-11-28: a node that had spent a moment before connecting named
    ENTRYPOINT_JOIN_TIMEOUT=19.9999 for a setting of 20; the message names the setting as
    given, and the time waited."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once closed
    lines: list[str] = []
    with pytest.raises(transport.PeersError) as err:
        control_channel.connect(
            "127.0.0.1", port, timeout=1.0, setting=20.0, log=lines.append, progress_every=0.3
        )
    assert f"at 127.0.0.1:{port} did not answer within 1 s (ENTRYPOINT_JOIN_TIMEOUT=20);" in str(
        err.value
    )
    assert lines and all(line.endswith("giving up after 1 s") for line in lines), lines


@pytest.mark.parametrize("end", ["closed", "reset", "this node's own close", "silence"])
def test_a_hang_up_is_only_node_0s_host_closing_the_connection(end):
    """`hung_up` (which lets the survivors free a lost node 0's seat before its lease ends) is
    set only by what node 0's own host sends when its process ends: the end of the stream, or
    a reset. This node closing its own socket, or node 0 falling silent, is no hang-up."""
    listener = socket.create_server(("127.0.0.1", 0))
    mine = socket.create_connection(listener.getsockname())
    theirs, _ = listener.accept()
    channel = control_channel.Channel(mine, "127.0.0.1")
    if end == "reset":
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if end in ("closed", "reset"):
        theirs.close()
    elif end == "this node's own close":
        channel.close()
    assert channel.receive(0.5) == []
    assert channel.closed == (end != "silence")
    assert channel.hung_up == (end in ("closed", "reset"))
    theirs.close()
    listener.close()


def test_a_failed_server_calls_its_hook_before_it_closes_a_connection():
    """A bug in node 0's server: `failed` runs (node 0's trainers killed) while every member's
    connection is still open, so the hang-up the survivors then hear, which frees node 0's seat,
    comes after node 0's trainers are gone."""

    class Broken(Conductor):
        def tick(self, now):
            raise RuntimeError("a bug")

    seen: list[bool] = []
    mine: list[socket.socket] = []

    def failed() -> None:  # the member's end: no end of stream yet (the challenge, or nothing)
        mine[0].setblocking(False)
        try:
            seen.append(mine[0].recv(65536) != b"")
        except BlockingIOError:
            seen.append(True)

    logged: list[str] = []
    server = control_server.Server(
        Broken(2, Limits(), time.monotonic()),
        0,
        heartbeat_interval=60,
        log=lambda level, text: logged.append(text),
        failed=failed,
    )
    mine.append(socket.create_connection(("127.0.0.1", server.port)))
    time.sleep(0.2)  # accepted before the first tick
    server.start()
    assert server.finished.wait(5)
    assert seen == [True], seen
    assert any("node 0's control server failed: RuntimeError('a bug')" in x for x in logged)
    mine[0].settimeout(5)
    while mine[0].recv(65536):  # what the server queued, then the end of stream: after the hook
        pass
    mine[0].close()
