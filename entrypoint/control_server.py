"""Node 0's side of the control channel: the `Server` thread accepts every node's connection,
checks each line (entrypoint.messages) and carries out the pure `Conductor`'s actions. Writes
never block: what a slow peer cannot take waits in its own buffer, up to MAX_OUT."""

from __future__ import annotations

import dataclasses
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable

from entrypoint import messages as m
from entrypoint import sockets
from entrypoint.conductor import Conductor
from entrypoint.conductor_terms import ALL, Close, Log, Send
from entrypoint.control import NO_IDENTITY, PROTOCOL, Lines, raise_open_files_limit
from entrypoint.errors import ConfigError
from entrypoint.identity import Identity
from entrypoint.message_fields import shown

HELLO_TIMEOUT = 30.0  # seconds from connect to a valid hello; a node collects its fingerprint
MAX_OUT = 4 << 20  # bytes waiting for one peer; a peer that takes none is stuck (or hostile)
MAX_BAD_LINES = 100  # invalid lines a member may send (logged, skipped) before it is dropped
_LOG_BURST = 20  # drops logged per minute; past that, one line says how many more
REFUSALS_LOGGED = 5  # refusal lines per address per window; past that, one line says how many
REFUSAL_WINDOW = 10.0  # seconds
MAX_REFUSING = 1024  # addresses counted apart; beyond, the others share one count


class Peer:
    """One accepted connection, as node 0 holds it."""

    def __init__(self, sock: socket.socket, address: str, now: float, ip: str = "") -> None:
        self.sock = sock
        self.address = address
        self.ip = ip or address  # the address without the port: what refusals are counted by
        self.accepted = now
        self.lines = Lines()
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
        bind: str = sockets.ANY,
        port_variable: str = "ENTRYPOINT_CONTROL_PORT",
        identity: Identity = NO_IDENTITY,
        hello_timeout: float = HELLO_TIMEOUT,
        max_pending: int | None = None,
        refusal_window: float = REFUSAL_WINDOW,
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
        try:
            self.listener = sockets.listen(bind, port)
        except OSError as err:
            raise ConfigError(
                port_variable,
                port,
                f"cannot listen on node 0 ({err.strerror})",
                f"Pick a free port with {port_variable} (default: MASTER_PORT + 1)",
            ) from None
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.peers: dict[socket.socket, Peer] = {}
        self.members: dict[int, Peer] = {}
        self.finished = threading.Event()
        self._halt = threading.Event()  # not `_stop`: threading.Thread has a method of that name
        self._dropped: list[float] = []  # when drops were logged, for the per-minute burst
        self._unlogged = 0
        self.refusal_window = refusal_window
        # Per address: [when its window began, refusals logged, refusals not logged].
        self._refusals: dict[str, list] = {}

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
            self._refusal_summaries(float("inf"))  # the counts not yet said
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
                self._refusal_summaries(now)
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
            peer = Peer(sock, sockets.peer_text(address), now, sockets.bare_ip(str(address[0])))
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

    def _read(self, peer: Peer) -> None:
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

    def _dispatch(self, peer: Peer, message: m.Message, now: float) -> None:
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

    def _hello(self, peer: Peer, hello: m.Hello, now: float) -> None:
        # The host is the peer's word, in every line logged about it from now on: escaped.
        hello = dataclasses.replace(hello, host=shown(hello.host))
        why = self._refusal(peer, hello)
        if why:
            peer.hello = peer.hello or hello
            who = f"node {hello.member} ({hello.host}, {peer.address})"
            self._refusal_log(peer.ip, f"refused {who}: {why}", now)
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

    def _refusal(self, peer: Peer, hello: m.Hello) -> str:
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
                f"it belongs to another job: {shown(hello.job) or 'no job identity'} there, "
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

    def _refusal_log(self, ip: str, text: str, now: float) -> None:
        """At most REFUSALS_LOGGED refusal lines per address per window (a flood of hellos
        must not flood the log); the rest are counted and said in one line when the window
        ends."""
        if ip not in self._refusals and len(self._refusals) >= MAX_REFUSING:
            ip = "other addresses"
        entry = self._refusals.setdefault(ip, [now, 0, 0])
        if entry[1] < REFUSALS_LOGGED:
            entry[1] += 1
            self.log("warning", text)
        else:
            entry[2] += 1

    def _refusal_summaries(self, now: float) -> None:
        for ip, (began, _, unlogged) in list(self._refusals.items()):
            if now - began >= self.refusal_window:
                del self._refusals[ip]
                if unlogged:
                    self.log(
                        "warning",
                        f"control port: {unlogged:,} more refused from {ip} in the last "
                        f"{self.refusal_window:g} s (not logged one by one)",
                    )

    def _closed(self, peer: Peer) -> None:
        member = peer.member
        self._drop(peer)
        if member is not None and self.members.get(member) is peer:
            del self.members[member]
            self._apply(self.conductor.closed(member, time.monotonic()))

    def _drop(self, peer: Peer) -> None:
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

    def _queue(self, peer: Peer, data: bytes) -> None:
        if peer.sock not in self.peers:
            return
        peer.out += data
        if len(peer.out) > MAX_OUT:
            self._dropped_log(f"dropped {peer.name()}: it has not read {len(peer.out)} bytes")
            self._closed(peer)
            return
        self._flush(peer)

    def _flush(self, peer: Peer) -> None:
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
