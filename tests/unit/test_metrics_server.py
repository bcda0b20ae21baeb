"""Node 0's /metrics port under a stranger's load, on loopback with real sockets: half-open
connections by the thousand (slowloris), an endless header, a silent connection; the server
stays one thread, drops them in turn, and a fresh scrape still answers."""

import socket
import threading
import time
import urllib.request

import pytest

from entrypoint.metrics.metrics_server import MAX_REQUEST, MetricsServer


@pytest.fixture
def server():
    s = MetricsServer(lambda: b"multinode_up 1\n", 0, "127.0.0.1", read_deadline=1.0)
    s.start()
    yield s
    s.shutdown()


def scrape(port: int) -> tuple[int, bytes, float]:
    began = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.status, response.read(), time.monotonic() - began


def test_a_scrape_answers(server):
    status, body, _ = scrape(server.port)
    assert (status, body) == (200, b"multinode_up 1\n")


def test_a_thousand_half_open_connections_hold_nothing(server):
    threads = threading.active_count()
    held = []
    for _ in range(1000):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        held.append(sock)
    try:
        assert threading.active_count() == threads  # no thread per connection
        assert len(server.open) <= 32
        status, body, took = scrape(server.port)  # a fresh scrape gets in at once
        assert status == 200 and took < 2, took
    finally:
        for sock in held:
            sock.close()
    assert server.dropped >= 1000 - 32


def test_an_endless_header_is_cut_off_and_a_silent_connection_dropped(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (MAX_REQUEST + 10))
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431")
    with socket.create_connection(("127.0.0.1", server.port)) as silent:
        silent.settimeout(5)
        began = time.monotonic()
        assert silent.recv(10) == b""  # closed by the server at its read deadline
        assert 0.5 < time.monotonic() - began < 3


def test_other_paths_and_methods(server):
    for request, status in (
        (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
        (b"GET /admin HTTP/1.1\r\n\r\n", b"404"),
    ):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(request)
            assert sock.recv(100).split(b" ")[1] == status


def test_a_signpost_sends_a_scrape_to_node_0_wherever_it_is_now(server):
    """A node other than node 0: its metrics port answers 307 to node 0's /metrics, read at
    each request (a takeover moves it); 503 while no node 0 is known. urllib, like Prometheus
    and `entrypoint status`, follows it."""
    from entrypoint.metrics.metrics_server import signpost

    where: list[str | None] = [f"http://127.0.0.1:{server.port}/metrics"]
    post = signpost(0, "127.0.0.1", lambda: where[0])
    assert post is not None
    try:
        status, body, _ = scrape(post.port)
        assert (status, body) == (200, b"multinode_up 1\n")  # followed to node 0
        with socket.create_connection(("127.0.0.1", post.port)) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 307") and f"Location: {where[0]}".encode() in answer
        where[0] = None  # electing a new node 0
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(post.port)
        assert refused.value.code == 503
    finally:
        post.shutdown()
    assert signpost(server.port, "127.0.0.1", lambda: None) is None  # node 0 holds the port
