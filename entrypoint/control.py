"""The entrypoints' own channel between nodes: JSON lines over TCP to node 0's control port.

Node 0 runs a `Server` (a thread carrying out the pure `Conductor`'s actions); every node,
node 0 included, is a client with a `Channel`. `connect` is how a node waits for node 0 in any
start order: it retries name resolution and connection with backoff, prints progress, and gives
up after ENTRYPOINT_JOIN_TIMEOUT with a message naming the address, the port, the time waited
and the likely causes.

Anything that can reach the port can connect (a port scanner, a health probe, a node of another
job), so the server trusts nothing: every line is decoded into a typed message and checked
(entrypoint.messages) before the Conductor sees it; a connection counts as a node only after
the handshake (its job identity and, with ENTRYPOINT_JOB_TOKEN, an HMAC over node 0's
challenge); one that sends garbage, a line longer than MAX_LINE, nothing within HELLO_TIMEOUT,
or that is one too many, is dropped and logged with its address, and the job goes on. Writes
never block: what a slow peer cannot take waits in its own buffer, up to a limit.
"""

from __future__ import annotations

import errno
import json
import resource
import secrets
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable

from entrypoint import messages as m
from entrypoint.conductor import ALL, Close, Conductor, Log, Send
from entrypoint.errors import EXIT_CONFIG, EXIT_PEERS, ConfigError
from entrypoint.identity import Identity

PROTOCOL = m.PROTOCOL
MAX_LINE = m.MAX_LINE
HELLO_TIMEOUT = 30.0  # seconds from connect to a valid hello; a node collects its fingerprint
MAX_OUT = 4 << 20  # bytes waiting for one peer; a peer that takes none is stuck (or hostile)
STATS_EVERY = 10.0  # seconds: a beat carries the GPU figures at most this often (node 0's CPU)
MAX_BAD_LINES = 100  # invalid lines a member may send (logged, skipped) before it is dropped
NO_IDENTITY = Identity()  # no platform job id, no token
_LOG_BURST = 20  # drops logged per minute; past that, one line says how many more


class PeersError(Exception):
    """The master or a peer is unavailable: exit EXIT_PEERS with this one line."""

    exit_code = EXIT_PEERS


class Refused(PeersError):
    """Node 0 refused this node (another job, a wrong token), or node 0 could not prove it
    belongs to this job: a configuration error, exit 2."""

    exit_code = EXIT_CONFIG


class _Lines:
    """Split a byte stream into lines, each byte looked at once however it arrives, and at
    most `limit` bytes held for a line not yet complete."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self.buffer = bytearray()
        self.limit = limit
        self.scanned = 0  # bytes of `buffer` known to hold no newline

    def feed(self, data: bytes) -> list[bytes]:
        """The complete, non-blank lines; ValueError when a line passes the limit."""
        self.buffer += data
        lines, start = [], 0
        while (end := self.buffer.find(b"\n", max(start, self.scanned))) >= 0:
            if end - start > self.limit:
                raise ValueError(f"a line of more than {self.limit} bytes")
            line = bytes(self.buffer[start:end])
            if line.strip():
                lines.append(line)
            start = end + 1
        if start:
            del self.buffer[:start]
        self.scanned = len(self.buffer)
        if self.scanned > self.limit:
            raise ValueError(f"a line of more than {self.limit} bytes")
        return lines


def raise_open_files_limit() -> int:
    """Node 0 holds a socket per node: lift the soft limit on open files to the hard one
    (often 1024 soft on a bare machine). Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return want
        except (ValueError, OSError):
            pass
    return soft


# -- node 0 ---------------------------------------------------------------------------------


class _Peer:
    """One accepted connection, as node 0 holds it."""

    def __init__(self, sock: socket.socket, address: str, now: float) -> None:
        self.sock = sock
        self.address = address
        self.accepted = now
        self.lines = _Lines()
        self.out = bytearray()
        self.nonce = secrets.token_hex(16)  # node 0's challenge to this connection
        self.member: int | None = None  # set once the handshake passed
        self.hello: m.Hello | None = None
        self.bad_lines = 0
        self.closing = False  # refused: flush what is queued, then close
        self.writing = False  # registered for EVENT_WRITE: output waits for the socket

    def name(self) -> str:
        if self.hello is None:
            return f"a connection from {self.address}"
        return f"node {self.hello.member} ({self.hello.host}, {self.address})"


class Server(threading.Thread):
    """Node 0's side: accepts every node's connection and carries out the Conductor's actions."""

    def __init__(
        self,
        conductor: Conductor,
        port: int,
        *,
        heartbeat_interval: float,
        log: Callable[[str, str], None],
        bind: str = "0.0.0.0",
        port_variable: str = "ENTRYPOINT_CONTROL_PORT",
        identity: Identity = NO_IDENTITY,
        hello_timeout: float = HELLO_TIMEOUT,
        max_pending: int | None = None,
    ) -> None:
        super().__init__(name="entrypoint-control", daemon=True)
        self.conductor = conductor
        self.interval = heartbeat_interval
        self.log = log
        self.identity = identity
        self.hello_timeout = hello_timeout
        # Connections not yet through the handshake: every node may be joining at once.
        self.max_pending = max_pending or conductor.expected + 64
        raise_open_files_limit()
        self.selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((bind, port))
        except OSError as err:
            self.listener.close()
            raise ConfigError(
                port_variable,
                port,
                f"cannot listen on node 0 ({err.strerror})",
                f"Pick a free port with {port_variable} (default: MASTER_PORT + 1)",
            ) from None
        self.listener.listen(4096)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.peers: dict[socket.socket, _Peer] = {}
        self.members: dict[int, _Peer] = {}
        self.finished = threading.Event()
        self._halt = threading.Event()  # not `_stop`: threading.Thread has a method of that name
        self._dropped: list[float] = []  # when drops were logged, for the per-minute burst
        self._unlogged = 0

    def run(self) -> None:
        try:
            self._loop()
        except Exception as err:  # a bug here must not look like a silent node 0
            self.log(
                "error",
                f"node 0's control server failed: {err!r}; every node will stop "
                "when its heartbeat times out",
            )
        finally:
            for peer in list(self.peers.values()):
                self._flush(peer)
                self._drop(peer)
            self.selector.close()
            self.listener.close()
            self.finished.set()

    def stop(self) -> None:
        self._halt.set()

    def _loop(self) -> None:
        last_beat = last_tick = time.monotonic()
        ended_at = None
        held = False  # the last round was held up: what arrived meanwhile is read first
        while not self._halt.is_set():
            began = time.monotonic()
            ready = self.selector.select(timeout=0 if held else 0.2)
            for key, events in ready:
                if key.fileobj is self.listener:
                    self._accept()
                    continue
                sock = key.fileobj
                peer = self.peers.get(sock) if isinstance(sock, socket.socket) else None
                if peer is not None and events & selectors.EVENT_WRITE:
                    self._flush(peer)
                if peer is not None and events & selectors.EVENT_READ and key.fileobj in self.peers:
                    self._read(peer)
            now = time.monotonic()
            # A round far longer than its poll (this process stopped, starved of CPU or of the
            # GIL; a poll that outlived its timeout returns nothing): the nodes' heartbeats may
            # be waiting unread, so silence is judged only after one more poll (one: a flood of
            # work must not hold up the heartbeats).
            held = not held and now - began > 0.7
            if now - last_tick >= 0.5 and not held:
                last_tick = now
                self._apply(self.conductor.tick(now))
                self._expire(now)
            if now - last_beat >= self.interval:
                last_beat = now
                self._send(ALL, m.Beat())
            if self.conductor.phase == "end":
                ended_at = ended_at or now
                # The verdict is queued for every node; a moment for them to read it, not for
                # a paused one to come back.
                if not self.peers or now - ended_at > 1:
                    return

    # -- connections ----------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(256):  # a burst of joins is taken in one go, a flood does not starve
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of file descriptors, say: the job goes on
                self._dropped_log(f"could not accept a connection: {err.strerror}")
                return
            now = time.monotonic()
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _Peer(sock, f"{address[0]}:{address[1]}", now)
            # Members are peers too: fewer peers than members + max_pending, no need to count.
            pending = (
                [p for p in self.peers.values() if p.member is None]
                if len(self.peers) - len(self.members) >= self.max_pending
                else []
            )
            if len(pending) >= self.max_pending:
                # Full of connections that have not said hello: the oldest goes, so that a
                # flood delays a real node's join but cannot lock it out.
                oldest = min(pending, key=lambda p: p.accepted)
                self._dropped_log(
                    f"dropped {oldest.name()}: more than {self.max_pending} "
                    "connections waiting for their hello"
                )
                self._drop(oldest)
            self.peers[sock] = peer
            self.selector.register(sock, selectors.EVENT_READ, None)
            self._queue(
                peer, m.encode(m.Challenge(peer.nonce, self.identity.job, self.identity.auth))
            )

    def _expire(self, now: float) -> None:
        for peer in [p for p in self.peers.values() if p.member is None]:
            if now - peer.accepted > self.hello_timeout:
                self._dropped_log(
                    f"dropped {peer.name()}: no hello within {self.hello_timeout:g} s"
                )
                self._drop(peer)

    def _read(self, peer: _Peer) -> None:
        try:
            data = peer.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._closed(peer)
            return
        if peer.closing:
            return
        try:
            lines = peer.lines.feed(data)
        except ValueError as err:
            self._dropped_log(f"dropped {peer.name()}: {err}")
            self._closed(peer)
            return
        for line in lines:
            if peer.sock not in self.peers or peer.closing:
                return
            try:
                message = m.decode(line)
            except m.BadMessage as err:
                if peer.member is None:
                    self._dropped_log(f"dropped {peer.name()}: {err}")
                    self._drop(peer)
                    return
                peer.bad_lines += 1
                if peer.bad_lines > MAX_BAD_LINES:
                    self._dropped_log(f"dropped {peer.name()}: {MAX_BAD_LINES} invalid lines")
                    self._closed(peer)
                    return
                self._dropped_log(f"skipped a line from {peer.name()}: {err}")
                continue
            self._dispatch(peer, message, time.monotonic())

    def _dispatch(self, peer: _Peer, message: m.Message, now: float) -> None:
        if isinstance(message, m.Hello):
            self._hello(peer, message, now)
        elif peer.member is None:
            self._dropped_log(f"dropped {peer.name()}: sent {message.kind} before its hello")
            self._drop(peer)
        elif isinstance(message, m.Beat):
            self._apply(self.conductor.beat(peer.member, message, now))
        elif isinstance(message, m.Exit):
            self._apply(self.conductor.exited(peer.member, message, now))
        elif isinstance(message, m.Signal):
            self._apply(self.conductor.signalled(peer.member, message, now))

    def _hello(self, peer: _Peer, hello: m.Hello, now: float) -> None:
        why = self._refusal(peer, hello)
        if why:
            peer.hello = peer.hello or hello
            who = f"node {hello.member} ({hello.host}, {peer.address})"
            self.log("warning", f"refused {who}: {why}")
            self._queue(peer, m.encode(m.Refuse(f"node 0 refused {who}: {why}")))
            peer.closing = True
            self._flush(peer)
            if not peer.out:
                self._drop(peer)
            return
        first = peer.member is None
        peer.member, peer.hello = hello.member, hello
        if first:
            welcome = (
                m.welcome_proof(
                    self.identity.token, peer.nonce, hello.nonce, self.identity.job, hello.member
                )
                if self.identity.token
                else ""
            )
            self._queue(peer, m.encode(m.Welcome(welcome)))
        old = self.members.get(hello.member)
        self.members[hello.member] = peer
        if old is not None and old is not peer:
            # The same member again on a new connection: the Conductor decides (a node whose
            # platform restarted it, or two nodes claiming one rank). The older connection is
            # only forgotten, not closed, so that its verdict still reaches it.
            old.member = None
        self._apply(self.conductor.hello(hello.member, hello, now, time.time()))

    def _refusal(self, peer: _Peer, hello: m.Hello) -> str:
        """Why this hello does not come from a node of this job ('' when it does)."""
        if hello.protocol != PROTOCOL:
            return (
                f"it speaks control protocol {hello.protocol}, node 0 speaks {PROTOCOL}: "
                "run the same image on every node"
            )
        if peer.member is not None and hello.member != peer.member:
            return f"it joined as node {peer.member} and now says it is node {hello.member}"
        if hello.job != self.identity.job:
            return (
                f"it belongs to another job: {hello.job or 'no job identity'} there, "
                f"{self.identity.job or 'no job identity'} on node 0. Start every node of "
                "one job from one submission, or give them one ENTRYPOINT_JOB_ID"
            )
        token = self.identity.token
        if hello.auth != self.identity.auth:
            has, lacks = ("it", "node 0") if token is None else ("node 0", "it")
            return (
                f"{has} has a job token (ENTRYPOINT_JOB_TOKEN), {lacks} has none: give "
                "every node the same token, or none"
            )
        if token is not None and not m.same(
            hello.proof,
            m.hello_proof(token, peer.nonce, hello.nonce, self.identity.job, hello.member),
        ):
            return (
                "wrong job token: its ENTRYPOINT_JOB_TOKEN is not node 0's. Give every "
                "node the same token"
            )
        return ""

    def _closed(self, peer: _Peer) -> None:
        member = peer.member
        self._drop(peer)
        if member is not None and self.members.get(member) is peer:
            del self.members[member]
            self._apply(self.conductor.closed(member, time.monotonic()))

    def _drop(self, peer: _Peer) -> None:
        if self.peers.pop(peer.sock, None) is None:
            return
        try:
            self.selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        try:
            peer.sock.close()
        except OSError:
            pass

    def _dropped_log(self, text: str) -> None:
        now = time.monotonic()
        self._dropped = [t for t in self._dropped if now - t < 60]
        if len(self._dropped) < _LOG_BURST:
            if self._unlogged:
                text += f" ({self._unlogged} more not logged in the last minute)"
                self._unlogged = 0
            self._dropped.append(now)
            self.log("warning", f"control port: {text}")
        else:
            self._unlogged += 1

    # -- actions and writes ---------------------------------------------------------------

    def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send(action.to, action.message)
            elif isinstance(action, Log):
                self.log(action.level, action.text)
            elif isinstance(action, Close):
                peer = self.members.pop(action.member, None)
                if peer is not None:
                    peer.member = None
                    peer.closing = True
                    self._flush(peer)
                    if not peer.out:
                        self._drop(peer)

    def _send(self, to: int, message: m.Message) -> None:
        data = m.encode(message)
        targets = list(self.members.values()) if to == ALL else [self.members.get(to)]
        for peer in targets:
            if peer is not None:
                self._queue(peer, data)

    def _queue(self, peer: _Peer, data: bytes) -> None:
        if peer.sock not in self.peers:
            return
        peer.out += data
        if len(peer.out) > MAX_OUT:
            self._dropped_log(f"dropped {peer.name()}: it has not read {len(peer.out)} bytes")
            self._closed(peer)
            return
        self._flush(peer)

    def _flush(self, peer: _Peer) -> None:
        """Send what the socket takes now; the rest waits for it to be writable. A partial
        write keeps its tail in order, so a stream is never corrupted."""
        if peer.sock not in self.peers:
            return
        while peer.out:
            try:
                sent = peer.sock.send(peer.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                peer.out.clear()
                break
            del peer.out[:sent]
        if bool(peer.out) != peer.writing:
            peer.writing = bool(peer.out)
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.out else 0)
            try:
                self.selector.modify(peer.sock, want, None)
            except (KeyError, ValueError):
                pass
        if peer.closing and not peer.out:
            self._drop(peer)


# -- every node -----------------------------------------------------------------------------


class Channel:
    """A node's connection to node 0, through the handshake."""

    def __init__(
        self,
        sock: socket.socket,
        address: str,
        identity: Identity = NO_IDENTITY,
        challenge: m.Challenge | None = None,
    ) -> None:
        self.sock = sock
        self.address = address
        self.identity = identity
        self.challenge = challenge
        self.nonce = secrets.token_hex(16)
        self.member: int | None = None
        self.lines = _Lines()
        self._last_heard = time.monotonic()
        self.closed = False
        self.welcomed = False
        self.stats_sent = float("-inf")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def last_heard(self) -> float:
        """When this node last found node 0's data: bytes waiting unread count, so that a node
        held up (stopped, starved) between reading and judging node 0's silence does not take
        a node 0 that kept beating for a silent one."""
        if not self.closed and self._last_heard < time.monotonic() - 0.5:
            try:
                if select.select([self.sock], [], [], 0)[0]:
                    self._last_heard = time.monotonic()
            except (OSError, ValueError):
                pass
        return self._last_heard

    @last_heard.setter
    def last_heard(self, when: float) -> None:
        self._last_heard = when

    def send(self, message: dict) -> bool:
        """Send one message given as a dict (its wire form); a hello gets this node's proof."""
        if message.get("t") == "hello":
            self.member = int(message["member"])
            challenge = self.challenge
            proof = (
                m.hello_proof(
                    self.identity.token, challenge.nonce, self.nonce, self.identity.job, self.member
                )
                if self.identity.token and challenge
                else ""
            )
            message = message | {
                "protocol": PROTOCOL,
                "job": self.identity.job,
                "auth": self.identity.auth,
                "nonce": self.nonce,
                "proof": proof,
            }
        elif message.get("t") == "beat" and message.get("stats"):
            # The figures are for node 0's table (every few minutes); a bare beat costs node 0
            # a fifth of the CPU of one with 8 GPUs' figures, at 1,024 nodes every second.
            now = time.monotonic()
            if now - self.stats_sent < STATS_EVERY:
                message = {"t": "beat"}
            else:
                self.stats_sent = now
        try:
            data = m.encode(m.from_dict(message))
        except m.BadMessage:
            # This node's own bug: node 0 skips the line and logs why; this node goes on.
            data = (json.dumps(message, default=str) + "\n").encode()
        try:
            self.sock.settimeout(2.0)
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def receive(self, timeout: float) -> list[dict]:
        """Messages from node 0 that arrived within `timeout` seconds, each checked; sets
        `closed` on EOF. Raises Refused when node 0 refused this node or failed its proof."""
        if self.closed:
            return []
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return []
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return []
        self.last_heard = time.monotonic()
        try:
            lines = self.lines.feed(data)
        except ValueError:
            self.closed = True
            return []
        out = []
        for line in lines:
            try:
                message = m.decode(line, m.FROM_NODE_0)
            except m.BadMessage:
                continue  # node 0 is the same program: a line it did not mean is skipped
            if isinstance(message, m.Refuse):
                raise Refused(message.reason)
            if isinstance(message, m.Welcome):
                self._check_welcome(message)
                continue
            if isinstance(message, m.Challenge):
                continue
            out.append(message.to_wire())
        return out

    def _check_welcome(self, welcome: m.Welcome) -> None:
        token, challenge = self.identity.token, self.challenge
        if (
            token
            and challenge
            and not m.same(
                welcome.proof,
                m.welcome_proof(
                    token, challenge.nonce, self.nonce, self.identity.job, self.member or 0
                ),
            )
        ):
            raise Refused(
                f"node 0 at {self.address} could not prove that it holds this job's "
                "ENTRYPOINT_JOB_TOKEN: it belongs to another job, or the tokens "
                "differ. Give every node the same token"
            )
        self.welcomed = True

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
    if isinstance(err, TimeoutError) or err.errno == errno.ETIMEDOUT:
        return "no answer (a firewall, a wrong address, or node 0 is unreachable)"
    if err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "no route to it"
    return err.strerror or str(err)


def _challenge(sock: socket.socket, address: str, wait: float) -> m.Challenge:
    """Node 0's first line on a new connection. OSError when the connection ends first (node
    0 full, or starting); PeersError when what answers is not an entrypoint."""
    lines, end = _Lines(), time.monotonic() + wait
    while time.monotonic() < end:
        sock.settimeout(max(0.05, end - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        if not data:
            raise ConnectionResetError(errno.ECONNRESET, "node 0 closed the connection")
        try:
            got = lines.feed(data)
        except ValueError:
            got = [b"?"]
        if got:
            try:
                challenge = m.decode(got[0], frozenset({"challenge"}))
            except m.BadMessage:
                break
            if not isinstance(challenge, m.Challenge):  # decode let only a challenge through
                break
            if challenge.protocol != PROTOCOL:
                raise Refused(
                    f"node 0 at {address} speaks control protocol "
                    f"{challenge.protocol}, this node {PROTOCOL}: run the same image "
                    "on every node"
                )
            return challenge
    raise PeersError(
        f"what answers at {address} is not node 0's entrypoint, or not one of "
        f"this version (no challenge "
        f"within {wait:g} s): check MASTER_ADDR and ENTRYPOINT_CONTROL_PORT"
    )


def connect(
    host: str,
    port: int,
    *,
    timeout: float,
    log: Callable[[str], None],
    progress_every: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    identity: Identity = NO_IDENTITY,
    challenge_wait: float = 30.0,
) -> Channel:
    """Connect to node 0's control port, waiting for it in any start order (bounded), and
    take its challenge."""
    start = time.monotonic()
    deadline = start + timeout
    delay, next_progress, why = 0.25, start + progress_every, "not tried"
    while True:
        try:
            infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
            address = infos[0][4]  # AF_INET: (ip, port)
            sock = socket.create_connection(
                (str(address[0]), int(address[1])),
                timeout=min(5.0, max(0.5, deadline - time.monotonic())),
            )
            try:
                challenge = _challenge(sock, f"{host}:{port}", challenge_wait)
            except BaseException:
                sock.close()
                raise
            return Channel(sock, f"{host}:{port}", identity, challenge)
        except OSError as err:
            why = _why(err)
        now = time.monotonic()
        if now >= deadline:
            raise PeersError(
                f"node 0's entrypoint at {host}:{port} did not answer within {now - start:.0f} s "
                f"(ENTRYPOINT_JOIN_TIMEOUT={timeout:g}); last try: {why}. Likely causes: node 0 "
                "did not start or failed (see its log), MASTER_ADDR is not node 0's address, or "
                "a firewall or network policy blocks the port between nodes"
            )
        if now >= next_progress:
            log(
                f"waiting for node 0 at {host}:{port}: {why}; {now - start:.0f} s so far, giving "
                f"up after {timeout:g} s"
            )
            next_progress = now + progress_every
        sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 2, 5.0)
