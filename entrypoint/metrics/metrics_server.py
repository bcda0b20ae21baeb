"""Node 0's `/metrics` over HTTP, bounded against whoever can reach the port: one thread for every
connection (a selector loop), at most MAX_CONNECTIONS open at once (a new one takes the place of
the one that has waited longest, so that a fresh scrape always gets in), a request of at most
MAX_REQUEST bytes read within READ_DEADLINE seconds, an answer written within WRITE_DEADLINE.
Thread count and memory stay flat whatever a stranger sends: half-open connections by the
thousand are dropped in turn, never held. GET /metrics (or /) answers Prometheus' text format,
made at that moment by `render()`; anything else gets 404, 405 or 431.

A node other than node 0 serves the same port as a signpost (`redirect`): GET /metrics answers
307 to node 0's /metrics wherever node 0 is now (after a takeover too), so that `entrypoint
status <any node>` and a Prometheus that scrapes every node find it; 503 while no node 0 is
known."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from entrypoint.control import sockets

MAX_CONNECTIONS = 32
MAX_REQUEST = 8 << 10  # bytes of request line and headers; Prometheus sends about 300
READ_DEADLINE = 5.0  # seconds from the accept to the end of the request's headers
WRITE_DEADLINE = 10.0  # seconds to take the whole answer
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class _Connection:
    sock: socket.socket
    opened: float
    request: bytearray = field(default_factory=bytearray)
    answer: bytes = b""
    answered_at: float | None = None


class MetricsServer(threading.Thread):
    """Serves `render()` at /metrics on `port` until `shutdown()`."""

    def __init__(
        self,
        render: Callable[[], bytes],
        port: int,
        bind: str = sockets.ANY,
        *,
        max_connections: int = MAX_CONNECTIONS,
        read_deadline: float = READ_DEADLINE,
        redirect: Callable[[], str | None] | None = None,
    ) -> None:
        super().__init__(name="entrypoint-metrics", daemon=True)
        self.render = render
        self.redirect = redirect
        self.listener = sockets.listen(bind, port)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.max_connections = max_connections
        self.read_deadline = read_deadline
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.open: dict[socket.socket, _Connection] = {}  # in the order they were accepted
        self.dropped = 0  # connections closed for their deadline or to make room
        self._halt = threading.Event()

    def stop(self) -> None:
        """Ask the thread to close the port (within half a second); `shutdown` waits for it."""
        self._halt.set()

    def shutdown(self) -> None:
        self.stop()
        self.join(timeout=2)

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                for key, events in self.selector.select(timeout=0.5):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif events & selectors.EVENT_READ:
                        self._read(self.open.get(key.fileobj))  # type: ignore[call-overload]
                    elif events & selectors.EVENT_WRITE:
                        self._write(self.open.get(key.fileobj))  # type: ignore[call-overload]
                self._expire(time.monotonic())
        finally:
            for conn in list(self.open.values()):
                self._close(conn)
            self.selector.close()
            self.listener.close()

    def _accept(self) -> None:
        for _ in range(64):  # a burst, then the others get their turn
            try:
                sock, _address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if len(self.open) >= self.max_connections:
                oldest = next(iter(self.open.values()))
                self.dropped += 1
                self._close(oldest)
            sock.setblocking(False)
            self.open[sock] = _Connection(sock, time.monotonic())
            self.selector.register(sock, selectors.EVENT_READ, None)

    def _read(self, conn: _Connection | None) -> None:
        if conn is None:
            return
        try:
            data = conn.sock.recv(MAX_REQUEST + 1 - len(conn.request))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.request += data
        end = conn.request.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.request) > MAX_REQUEST:
                self._answer(conn, 431, b"request headers too large\n")
            return
        self._answer(conn, *self._route(bytes(conn.request[:end])))

    def _route(self, head: bytes) -> tuple[int, bytes] | tuple[int, bytes, str]:
        method, _, rest = head.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return 405, b"only GET\n"
        if path not in (b"/metrics", b"/"):
            return 404, b"see /metrics\n"
        if self.redirect is not None:
            where = self.redirect()
            if where is None:
                return 503, b"this job has no node 0 now (it is electing one): ask again\n"
            return 307, f"node 0 serves the job's metrics at {where}\n".encode(), where
        try:
            return 200, self.render()
        except Exception as err:  # noqa: BLE001 - a scrape must not end the server
            return 500, f"metrics failed: {type(err).__name__}\n".encode()

    def _answer(self, conn: _Connection, status: int, body: bytes, location: str = "") -> None:
        reason = {
            200: "OK",
            307: "Temporary Redirect",
            404: "Not Found",
            405: "Method Not Allowed",
            500: "Error",
            503: "Service Unavailable",
        }.get(status, "Request Header Fields Too Large")
        moved = f"Location: {location}\r\n" if location else ""
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {CONTENT_TYPE}\r\n{moved}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        conn.answer, conn.answered_at = head + body, time.monotonic()
        conn.request.clear()
        self.selector.modify(conn.sock, selectors.EVENT_WRITE, None)
        self._write(conn)

    def _write(self, conn: _Connection | None) -> None:
        if conn is None:
            return
        try:
            sent = conn.sock.send(conn.answer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        conn.answer = conn.answer[sent:]
        if not conn.answer:
            self._close(conn)

    def _expire(self, now: float) -> None:
        for conn in list(self.open.values()):
            limit = (
                conn.opened + self.read_deadline
                if conn.answered_at is None
                else conn.answered_at + WRITE_DEADLINE
            )
            if now > limit:
                self.dropped += 1
                self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if self.open.pop(conn.sock, None) is None:
            return
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


def signpost(port: int, bind: str, where: Callable[[], str | None]) -> MetricsServer | None:
    """A node other than node 0: `port` answers 307 to `where()` (node 0's /metrics now); None
    where the port cannot be had (node 0 on the same host holds it: loopback jobs)."""
    try:
        server = MetricsServer(lambda: b"", port, bind, redirect=where)
    except OSError:
        return None
    server.start()
    return server
