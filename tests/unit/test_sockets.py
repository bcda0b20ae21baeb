"""Both address families on real sockets: node 0's dual-stack listener on `::` (its fallback
to IPv4 where the host has no IPv6), the addresses of a name interleaved, a connect that tries
each in turn, and node 0's control server joined over ::1, 127.0.0.1 and a name that resolves
to ::1. The same on a Docker IPv6 network would be a container test (tests/cluster)."""

from __future__ import annotations

import errno
import socket
import time

import pytest

from entrypoint.control import control_channel, control_server, sockets
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.state import Limits
from entrypoint.plan.values import host_port
from tests.unit.test_control import goes, hello, typed


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def ipv6(unavailable):
    """::1 to bind: a skip outside CI, a failure under CI=true (conftest's `unavailable`)."""
    if not _ipv6_loopback():
        unavailable("this host cannot bind ::1")


needs_ipv6 = pytest.mark.usefixtures("ipv6")
REAL_GETADDRINFO = socket.getaddrinfo


def resolving(monkeypatch, name: str, *ips: str) -> None:
    """`name` resolves to `ips` in that order (as /etc/hosts or DNS would), other names as
    before: the sockets stay real."""

    def fake(host, port, family=0, type=0, proto=0, flags=0):
        if host != name:
            return REAL_GETADDRINFO(host, port, family, type, proto, flags)
        out = []
        for ip in ips:
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            addr = (ip, port, 0, 0) if fam == socket.AF_INET6 else (ip, port)
            out.append((fam, socket.SOCK_STREAM, 6, "", addr))
        return out

    monkeypatch.setattr(socket, "getaddrinfo", fake)


@needs_ipv6
@pytest.mark.parametrize("ip", ["::1", "127.0.0.1"])
def test_the_dual_stack_listener_takes_both_families(ip):
    with sockets.listen(sockets.ANY, 0) as server:
        assert server.family == socket.AF_INET6
        assert server.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
        with socket.create_connection((ip, server.getsockname()[1]), timeout=5):
            peer, address = server.accept()
            peer.close()
    assert sockets.peer_text(address).startswith("[::1]:" if ip == "::1" else "127.0.0.1:")


def test_without_ipv6_the_listener_is_ipv4(monkeypatch):
    monkeypatch.setattr(socket, "has_ipv6", False)
    with sockets.listen(sockets.ANY, 0) as server:
        assert server.family == socket.AF_INET and server.getsockname()[0] == "0.0.0.0"


@pytest.mark.parametrize("code", [errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL])
def test_a_host_that_refuses_ipv6_falls_back_to_ipv4(monkeypatch, code):
    class NoIPv6(socket.socket):
        def bind(self, address):
            if self.family == socket.AF_INET6:
                raise OSError(code, "no IPv6 here")
            super().bind(address)

    monkeypatch.setattr(socket, "socket", NoIPv6)
    with sockets.listen(sockets.ANY, 0) as server:
        assert server.family == socket.AF_INET


def test_a_port_in_use_is_not_taken_for_a_host_without_ipv6():
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        with pytest.raises(OSError) as err:
            sockets.listen(sockets.ANY, taken.getsockname()[1]).close()
    assert err.value.errno == errno.EADDRINUSE


@pytest.mark.parametrize(
    ("sockaddr", "text"),
    [
        (("10.0.0.2", 40000), "10.0.0.2:40000"),
        (("::ffff:10.0.0.2", 40000, 0, 0), "10.0.0.2:40000"),
        (("fd00::2", 40000, 0, 0), "[fd00::2]:40000"),
        (("fe80::1%eth0", 40000, 0, 2), "[fe80::1%eth0]:40000"),
    ],
)
def test_a_peer_reads_as_people_write_it(sockaddr, text):
    assert sockets.peer_text(sockaddr) == text


def test_a_name_s_addresses_interleave_the_families_in_the_resolver_s_order(monkeypatch):
    resolving(monkeypatch, "node-0", "fd00::2", "fd00::3", "10.0.0.2", "fd00::2", "10.0.0.3")
    assert [a[1][0] for a in sockets.addresses("node-0", 1)] == [
        "fd00::2",
        "10.0.0.2",
        "fd00::3",
        "10.0.0.3",
    ]


@needs_ipv6
def test_connect_goes_on_to_the_next_address_when_one_refuses(monkeypatch):
    with sockets.listen("127.0.0.1", 0) as server:  # nothing on ::1 at this port
        resolving(monkeypatch, "node-0", "::1", "127.0.0.1")
        with sockets.connect("node-0", server.getsockname()[1], 5) as sock:
            assert sock.getpeername()[0] == "127.0.0.1"


def test_connect_says_why_when_no_address_answers(monkeypatch):
    with sockets.listen("127.0.0.1", 0) as server:
        port = server.getsockname()[1]
    resolving(monkeypatch, "node-0", "127.0.0.1")
    with pytest.raises(ConnectionRefusedError):
        sockets.connect("node-0", port, 2)


@pytest.fixture
def dual_stack_node0():
    lines: list[str] = []
    conductor = Conductor(
        2, Limits(join_timeout=60, heartbeat_timeout=30, monitor_interval=0), time.monotonic()
    )
    server = control_server.Server(
        conductor, 0, heartbeat_interval=0.5, log=lambda level, text: lines.append(text)
    )
    server.start()
    yield server, lines
    server.stop()
    server.join(timeout=5)


@needs_ipv6
@pytest.mark.parametrize(
    ("host", "resolves_to", "shown"),
    [
        ("::1", None, "[::1]:"),
        ("127.0.0.1", None, "127.0.0.1:"),  # over ::ffff:127.0.0.1, shown as IPv4
        ("node-0.ipv6.test", ("::1",), "[::1]:"),
        ("localhost", None, "127.0.0.1:"),  # /etc/hosts here: IPv4 only
    ],
)
def test_nodes_join_a_dual_stack_node_0(dual_stack_node0, monkeypatch, host, resolves_to, shown):
    server, lines = dual_stack_node0
    if resolves_to:
        resolving(monkeypatch, host, *resolves_to)
    channels = []
    for member in (0, 1):
        channel = control_channel.connect(host, server.port, timeout=10, log=print)
        channel.send(typed(hello(member)))
        channels.append(channel)
    goes(*channels)
    assert channels[0].address == host_port(host, server.port)
    assert all(peer.address.startswith(shown) for peer in server.members.values()), lines
    for channel in channels:
        channel.close()
