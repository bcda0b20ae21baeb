"""The entrypoints' own channel between nodes: JSON lines over TCP to node 0's control port.

Node 0 runs a `Server` (a thread carrying out the pure `Conductor`'s actions); every node,
node 0 included, is a client with a `Channel`. `connect` is how a node waits for node 0 in any
start order: it retries name resolution and connection with backoff, prints progress, and gives
up after ENTRYPOINT_JOIN_TIMEOUT with a message naming the address, the port, the time waited
and the likely causes.

Messages: client -> node 0: hello, beat, signal, exit; node 0 -> clients: go, stop, restart,
signal, beat, done.
"""

from __future__ import annotations

import errno
import json
import selectors
import socket
import threading
import time
from collections.abc import Callable

from entrypoint.conductor import ALL, Close, Conductor, Log, Send
from entrypoint.errors import EXIT_PEERS, ConfigError

PROTOCOL = 1
_MAX_LINE = 8 << 20  # a hello with every package listed is a few kB; refuse runaway input


class PeersError(Exception):
    """The master or a peer is unavailable: exit EXIT_PEERS with this one line."""

    exit_code = EXIT_PEERS


def _encode(message: dict) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


class _Lines:
    """Split a byte stream into JSON messages."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> list[dict]:
        self.buffer += data
        if len(self.buffer) > _MAX_LINE:
            raise ValueError("message too long")
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


# -- node 0 ---------------------------------------------------------------------------------

class Server(threading.Thread):
    """Node 0's side: accepts every node's connection and carries out the Conductor's actions."""

    def __init__(self, conductor: Conductor, port: int, *, heartbeat_interval: float,
                 log: Callable[[str, str], None], bind: str = "0.0.0.0",
                 port_variable: str = "ENTRYPOINT_CONTROL_PORT") -> None:
        super().__init__(name="entrypoint-control", daemon=True)
        self.conductor = conductor
        self.interval = heartbeat_interval
        self.log = log
        self.selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((bind, port))
        except OSError as err:
            self.listener.close()
            raise ConfigError(port_variable, port, f"cannot listen on node 0 ({err.strerror})",
                              f"Pick a free port with {port_variable} (default: MASTER_PORT + 1)"
                              ) from None
        self.listener.listen(1024)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.members: dict[int, socket.socket] = {}
        self.readers: dict[socket.socket, tuple[_Lines, list[int | None]]] = {}
        self.finished = threading.Event()
        self._stop = threading.Event()

    def run(self) -> None:
        try:
            self._loop()
        except Exception as err:  # a bug here must not look like a silent node 0
            self.log("error", f"node 0's control server failed: {err!r}; every node will stop "
                              "when its heartbeat times out")
        finally:
            for sock in list(self.readers):
                self._drop(sock)
            self.selector.close()
            self.listener.close()
            self.finished.set()

    def _loop(self) -> None:
        last_beat = last_tick = time.monotonic()
        ended_at = None
        while not self._stop.is_set():
            for key, _ in self.selector.select(timeout=0.2):
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._read(key.fileobj)
            now = time.monotonic()
            if now - last_tick >= 0.5:
                last_tick = now
                self._apply(self.conductor.tick(now))
            if now - last_beat >= self.interval:
                last_beat = now
                self._send(ALL, {"t": "beat"})
            if self.conductor.phase == "end":
                ended_at = ended_at or now
                # The verdict is in every socket's buffer already; a moment for the nodes to
                # read it, not for a paused one to come back.
                if not self.readers or now - ended_at > 1:
                    return

    def stop(self) -> None:
        self._stop.set()

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.readers[sock] = (_Lines(), [None])
        self.selector.register(sock, selectors.EVENT_READ, None)

    def _read(self, sock: socket.socket) -> None:
        lines, member = self.readers[sock]
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._closed(sock)
            return
        try:
            messages = lines.feed(data)
        except ValueError:
            self._closed(sock)
            return
        for message in messages:
            now = time.monotonic()
            kind = message.get("t")
            if kind == "hello":
                member_id = int(message.get("member", -1))
                if message.get("protocol") != PROTOCOL:
                    self._write(sock, {"t": "stop", "code": 2, "reason": (
                        f"node {member_id} speaks control protocol {message.get('protocol')}, node 0 "
                        f"speaks {PROTOCOL}: run the same image on every node")})
                    continue
                member[0] = member_id
                old = self.members.get(member_id)
                if old is not None and old is not sock and old in self.readers:
                    # A node started again: its old connection's late beats and close are no
                    # longer this member's.
                    self.readers[old][1][0] = None
                self.members[member_id] = sock
                self._apply(self.conductor.hello(member_id, message, now, time.time()))
            elif member[0] is None:
                continue
            elif kind == "beat":
                self._apply(self.conductor.beat(member[0], message, now))
            elif kind == "exit":
                self._apply(self.conductor.exited(member[0], message, now))
            elif kind == "signal":
                self._apply(self.conductor.signalled(member[0], message, now))

    def _closed(self, sock: socket.socket) -> None:
        member = self.readers.get(sock, (None, [None]))[1][0]
        self._drop(sock)
        if member is not None and self.members.get(member) is sock:
            del self.members[member]
            self._apply(self.conductor.closed(member, time.monotonic()))

    def _drop(self, sock: socket.socket) -> None:
        if sock in self.readers:
            del self.readers[sock]
            try:
                self.selector.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()

    def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send(action.to, action.message)
            elif isinstance(action, Log):
                self.log(action.level, action.text)
            elif isinstance(action, Close):
                sock = self.members.pop(action.member, None)
                if sock is not None:
                    self._drop(sock)

    def _send(self, to: int, message: dict) -> None:
        targets = list(self.members.values()) if to == ALL else [self.members.get(to)]
        for sock in targets:
            if sock is not None:
                self._write(sock, message)

    def _write(self, sock: socket.socket, message: dict) -> None:
        # Messages are small and rare; a peer too stuck to take a few bytes is caught by the
        # heartbeat timeout, so a short blocking send is enough.
        try:
            sock.settimeout(2.0)
            sock.sendall(_encode(message))
        except OSError:
            pass
        finally:
            try:
                sock.setblocking(False)
            except OSError:
                pass


# -- every node -----------------------------------------------------------------------------

class Channel:
    """A node's connection to node 0."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address
        self.lines = _Lines()
        self.last_heard = time.monotonic()
        self.closed = False
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, message: dict) -> bool:
        try:
            self.sock.settimeout(2.0)
            self.sock.sendall(_encode(message))
            return True
        except OSError:
            return False

    def receive(self, timeout: float) -> list[dict]:
        """Messages that arrived within `timeout` seconds; sets `closed` on EOF."""
        if self.closed:
            return []
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except (TimeoutError, socket.timeout, BlockingIOError, InterruptedError):
            return []
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return []
        self.last_heard = time.monotonic()
        try:
            return self.lines.feed(data)
        except ValueError:
            self.closed = True
            return []

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _why(err: OSError) -> str:
    if isinstance(err, socket.gaierror):
        return "the name does not resolve (yet)"
    if err.errno == errno.ECONNREFUSED:
        return "nothing listens there yet (node 0 not started, or still starting)"
    if isinstance(err, (TimeoutError, socket.timeout)) or err.errno == errno.ETIMEDOUT:
        return "no answer (a firewall, a wrong address, or node 0 is unreachable)"
    if err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "no route to it"
    return err.strerror or str(err)


def connect(host: str, port: int, *, timeout: float, log: Callable[[str], None],
            progress_every: float = 10.0, sleep: Callable[[float], None] = time.sleep) -> Channel:
    """Connect to node 0's control port, waiting for it in any start order (bounded)."""
    start = time.monotonic()
    deadline = start + timeout
    delay, next_progress, why = 0.25, start + progress_every, "not tried"
    while True:
        try:
            infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
            sock = socket.create_connection(infos[0][4], timeout=min(5.0, max(0.5, deadline -
                                                                                time.monotonic())))
            return Channel(sock, f"{host}:{port}")
        except OSError as err:
            why = _why(err)
        now = time.monotonic()
        if now >= deadline:
            raise PeersError(
                f"node 0's entrypoint at {host}:{port} did not answer within {now - start:.0f} s "
                f"(ENTRYPOINT_JOIN_TIMEOUT={timeout:g}); last try: {why}. Likely causes: node 0 "
                "did not start or failed (see its log), MASTER_ADDR is not node 0's address, or "
                "a firewall or network policy blocks the port between nodes")
        if now >= next_progress:
            log(f"waiting for node 0 at {host}:{port}: {why}; {now - start:.0f} s so far, giving "
                f"up after {timeout:g} s")
            next_progress = now + progress_every
        sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 2, 5.0)
