"""Node 0's side of the control channel: the `Server` thread accepts every node's connection, checks
each line (entrypoint.control.messages) and carries out the actions of node 0's mind (a `Mind`,
entrypoint.control.actions). Writes never block: what a slow peer cannot take waits in its own
buffer, up to MAX_OUT."""

from __future__ import annotations

import dataclasses
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

from entrypoint.control import messages as m
from entrypoint.control import sockets
from entrypoint.control.actions import ALL, Action, Close, Log, Mind, Send
from entrypoint.control.awake import AwakeClock
from entrypoint.control.control_guard import REFUSAL_WINDOW, Pending, Warnings, refusal
from entrypoint.control.identity import Identity
from entrypoint.control.message_fields import shown
from entrypoint.control.transport import NO_IDENTITY, Lines, raise_open_files_limit
from entrypoint.plan.errors import ConfigError

HELLO_TIMEOUT = 30.0  # seconds from connect to a valid hello; a node collects its fingerprint
MAX_OUT = 4 << 20  # bytes waiting for one peer; a peer that takes none is stuck (or hostile)
HELD_UP = 0.7  # seconds: a round (a poll of at most 0.2 s and its work) longer was held up
MAX_BAD_LINES = 100  # invalid lines a member may send (logged, skipped) before it is dropped


def listen_or_say(bind: str, port: int, variable: str, fix: str) -> socket.socket:
    """A listening socket on node 0, or the ConfigError that names the variable that set its
    port, the port and `fix` (the port is held by another process, or not this user's to take)."""
    try:
        return sockets.listen(bind, port)
    except OSError as err:
        raise ConfigError(
            variable, port, f"cannot listen on node 0 ({err.strerror})", fix
        ) from None


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


class Stoppable(Protocol):
    def stop(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...


class Server(threading.Thread):
    """Node 0's side: accepts every node's connection and carries out its mind's actions."""

    def __init__(
        self,
        mind: Mind,
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
        failed: Callable[[], None] | None = None,
    ) -> None:
        """failed: called when this server fails, before it closes its connections (node 0's
        trainers killed: the survivors then take its seat, supervise/takeover.py)."""
        super().__init__(name="entrypoint-control", daemon=True)
        self.mind = mind
        self.failed = failed
        self.interval = heartbeat_interval
        self.log = log
        self.identity = identity
        self.hello_timeout = hello_timeout
        # Connections not yet through the handshake: every node may be joining at once.
        self.max_pending = max_pending or mind.expected + 64
        raise_open_files_limit()
        self.selector = selectors.DefaultSelector()
        self.listener = listen_or_say(
            bind,
            port,
            port_variable,
            f"Pick a free port with {port_variable} (default: MASTER_PORT + 1)",
        )
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.peers: dict[socket.socket, Peer] = {}
        self.members: dict[int, Peer] = {}
        self.pending: Pending[Peer] = Pending()  # the peers not yet through their hello
        self.finished = threading.Event()
        self._halt = threading.Event()  # not `_stop`: threading.Thread has a method of that name
        # What node 0 serves beside it (its /metrics): asked to stop with it.
        self.beside: list[Stoppable] = []
        self.warnings = Warnings(log, refusal_window)
        self.clock = AwakeClock(slack=HELD_UP)

    def run(self) -> None:
        try:
            self._loop()
        except Exception as err:  # a bug here must not look like a silent node 0
            self.log(
                "error",
                f"node 0's control server failed: {err!r}; every node will stop "
                "when its heartbeat times out",
            )
            if self.failed is not None:
                self.failed()
        finally:
            self.warnings.summaries(float("inf"))  # the counts not yet said
            for peer in list(self.peers.values()):
                self._flush(peer)
                self._drop(peer)
            self.selector.close()
            self.listener.close()
            self.finished.set()

    def stop(self) -> None:
        self._halt.set()
        for other in self.beside:
            other.stop()

    def _loop(self) -> None:
        last_beat = last_tick = self.clock.round()
        ended_at = None
        held = False  # the last round was held up: what arrived meanwhile is read first
        while not self._halt.is_set():
            began = time.monotonic()
            ready = self.selector.select(timeout=0 if held else 0.2)
            self.clock.round()
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
            now = self.clock.now()
            # A round far longer than its poll (this process stopped, starved of CPU or of the
            # GIL; a poll that outlived its timeout returns nothing): the nodes' heartbeats may
            # be waiting unread, so silence is judged only after one more poll (one: a flood of
            # work must not hold up the heartbeats).
            held = not held and time.monotonic() - began > HELD_UP
            if now - last_tick >= 0.5 and not held:
                last_tick = now
                self._apply(self.mind.tick(now))
                self._expire(now)
                self.warnings.summaries(now)
            if now - last_beat >= self.interval:
                last_beat = now
                self._send(ALL, m.Beat())
            if self.mind.ended:
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
            now = self.clock.now()
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = Peer(sock, sockets.peer_text(address), now, sockets.bare_ip(str(address[0])))
            if len(self.pending) >= self.max_pending:
                self._make_room()
            self.peers[sock] = peer
            self.pending.add(peer)
            self.selector.register(sock, selectors.EVENT_READ, None)
            self._queue(
                peer, m.encode(m.Challenge(peer.nonce, self.identity.job, self.identity.auth))
            )

    def _make_room(self) -> None:
        """Full of connections that have not said hello: the oldest of the address holding
        the most goes, once what it sent is read (a hello already there is served, not
        dropped), so that a flood delays a real node's join but cannot lock it out."""
        for peer in self.pending.crowded():
            self._read(peer)
            if peer.sock in self.peers and peer.member is None:
                self._dropped_log(
                    f"dropped {peer.name()}: more than {self.max_pending} connections "
                    f"waiting for their hello (the most from {peer.ip})"
                )
                self._drop(peer)
            if len(self.pending) < self.max_pending:
                return

    def _expire(self, now: float) -> None:
        for peer in list(self.pending.older_than(now - self.hello_timeout)):
            if peer.sock in self.peers:
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
            self._dispatch(peer, message, self.clock.now())

    def _dispatch(self, peer: Peer, message: m.Message, now: float) -> None:
        member, c = peer.member, self.mind
        if isinstance(message, m.Hello):
            self._hello(peer, message, now)
            return
        if member is None:
            self._dropped_log(f"dropped {peer.name()}: sent {message.kind} before its hello")
            self._drop(peer)
            return
        match message:
            case m.Beat():
                self._apply(c.beat(member, message, now))
            case m.Exit():
                self._apply(c.exited(member, message, now))
            case m.Signal():
                self._apply(c.signalled(member, message, now))
            case m.Stacks():
                self._apply(c.stacks(member, message, now))
            case m.Health(where=where, text=text):
                # The event's words are the node's: escaped, as its host name is.
                shown_message = dataclasses.replace(
                    message, where=shown(where, 200), text=shown(text, 1000)
                )
                self._apply(c.health(member, shown_message, now))

    def _hello(self, peer: Peer, hello: m.Hello, now: float) -> None:
        # The host is the peer's word, in every line logged about it from now on: escaped.
        hello = dataclasses.replace(
            hello, host=shown(hello.host), unhealthy=shown(hello.unhealthy, 4096)
        )
        why = refusal(self.identity, hello, peer.member, peer.nonce)
        if why:
            peer.hello = peer.hello or hello
            who = f"node {hello.member} ({hello.host}, {peer.address})"
            self.warnings.refused(peer.ip, f"refused {who}: {why}", now)
            self._queue(peer, m.encode(m.Refuse(f"node 0 refused {who}: {why}")))
            peer.closing = True
            self._flush(peer)
            if not peer.out:
                self._drop(peer)
            return
        if hello.holds:  # a knock (supervise/knock.py): answered, closed, never a member
            self.pending.discard(peer)
            self._apply(self.mind.hello(hello.member, hello, now, time.time()))
            peer.closing = True
            self._flush(peer)
            if not peer.out:
                self._drop(peer)
            return
        first = peer.member is None
        peer.member, peer.hello = hello.member, hello
        self.pending.discard(peer)
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
            # The same member again on a new connection: the mind decides (a node whose
            # platform restarted it, or two nodes claiming one rank). The older connection is
            # only forgotten, not closed, so that its verdict still reaches it.
            self._forget(old)
        self._apply(self.mind.hello(hello.member, hello, now, time.time()))

    def _forget(self, peer: Peer) -> None:
        """No longer a member: waits like a new connection (its verdict, then its close)."""
        peer.member = None
        self.pending.add(peer)

    def _closed(self, peer: Peer) -> None:
        member = peer.member
        self._drop(peer)
        if member is not None and self.members.get(member) is peer:
            del self.members[member]
            self._apply(self.mind.closed(member, self.clock.now()))

    def _drop(self, peer: Peer) -> None:
        self.pending.discard(peer)
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
        self.warnings.dropped(text, self.clock.now())

    # -- actions and writes ---------------------------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Send(to=to, message=message):
                    self._send(to, message)
                case Log(level=level, text=text):
                    self.log(level, text)
                case Close(member=member):
                    peer = self.members.pop(member, None)
                    if peer is not None:
                        self._forget(peer)
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
