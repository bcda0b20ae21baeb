"""Every node's side of the control channel: `connect` waits for node 0 in any start order
(bounded by ENTRYPOINT_JOIN_TIMEOUT), takes its challenge, and returns the `Channel` that the
node sends and receives on."""

from __future__ import annotations

import errno
import json
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from entrypoint.control import messages as m
from entrypoint.control import sockets
from entrypoint.control.awake import AwakeClock
from entrypoint.control.identity import Identity
from entrypoint.control.message_fields import shown
from entrypoint.control.messages import STATS_EVERY
from entrypoint.control.transport import (
    NO_IDENTITY,
    PROTOCOL,
    Lines,
    PeersError,
    Refused,
)
from entrypoint.plan.values import host_port

SEND_TIMEOUT = 2.0  # seconds a message may wait for room in the socket's buffer


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
        self.lines = Lines()
        self._last_heard = time.monotonic()
        # Node 0's silence counts only while this node was awake to hear it: `silent()` is
        # called every round of whichever loop runs (0.2 to 0.5 s of waiting, and its work).
        self._awake = AwakeClock(slack=1.5)
        self.closed = False
        # closed by node 0's host (an end of stream or a reset): its process ended or closed
        # it; an error of this node's own network (unreachable, timed out) is no hang-up
        self.hung_up = False
        self.welcomed = False
        self.stats_sent = float("-inf")
        # Two threads send (the heartbeat's and the supervising loop): one message at a time,
        # and no timeout of the socket's own that one thread's call would change for the other.
        self._sending = threading.Lock()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)

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

    def silent(self) -> float:
        """Seconds since node 0 was last heard, less the time this node was held up itself
        (entrypoint.control.awake)."""
        self._awake.round()
        return self._awake.since(self.last_heard)

    def send(self, message: m.Message) -> bool:
        """Send one message; a hello gets this node's proof, a beat its GPUs' figures only
        every STATS_EVERY seconds. False: node 0 took nothing for SEND_TIMEOUT seconds."""
        match message:
            case m.Hello():
                self.member = message.member
                challenge = self.challenge
                proof = (
                    m.hello_proof(
                        self.identity.token,
                        challenge.nonce,
                        self.nonce,
                        self.identity.job,
                        self.member,
                    )
                    if self.identity.token and challenge
                    else ""
                )
                message = replace(
                    message,
                    protocol=PROTOCOL,
                    job=self.identity.job,
                    auth=self.identity.auth,
                    nonce=self.nonce,
                    proof=proof,
                )
            case m.Beat(stats=stats) if stats:
                # The figures are for node 0's table (every few minutes); a bare beat costs
                # node 0 a fifth of the CPU of one with 8 GPUs' figures, at 1,024 nodes every
                # second.
                now = time.monotonic()
                if now - self.stats_sent < STATS_EVERY:
                    # The ranks' progress goes every beat: hangs and slow ranks are judged
                    # from it.
                    message = m.Beat(ranks=message.ranks)
                else:
                    self.stats_sent = now
        data = _checked(message)
        with self._sending:
            try:
                self._send_all(data, SEND_TIMEOUT)
                return True
            except OSError:
                return False

    def _send_all(self, data: bytes, timeout: float) -> None:
        deadline, view = time.monotonic() + timeout, memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view) :]
            except (BlockingIOError, InterruptedError):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [self.sock], [], left)[1]:
                    raise TimeoutError(f"node 0 took nothing for {timeout:g} s") from None

    def receive(self, timeout: float) -> list[m.Message]:
        """Messages from node 0 that arrived within `timeout` seconds, each checked; sets
        `closed` on EOF. Raises Refused when node 0 refused this node or failed its proof."""
        if self.closed:
            return []
        try:
            if not select.select([self.sock], [], [], timeout)[0]:
                return []
            data = self.sock.recv(65536)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return []
        except ValueError:  # closed meanwhile
            data = b""
        except (ConnectionResetError, BrokenPipeError):
            data, self.hung_up = b"", True
        except OSError:
            data = b""
        else:
            self.hung_up = not data
        if not data:
            self.closed = True
            return []
        self.last_heard = time.monotonic()
        try:
            lines = self.lines.feed(data)
        except ValueError:
            self.closed = True
            return []
        out: list[m.Message] = []
        for line in lines:
            try:
                message = m.decode(line, m.FROM_NODE_0)
            except m.BadMessage:
                continue  # node 0 is the same program: a line it did not mean is skipped
            match message:
                case m.Refuse(reason=reason):
                    raise Refused(shown(reason, 2000))  # node 0's word, not yet proven
                case m.Welcome():
                    self._check_welcome(message)
                    continue
                case m.Challenge():
                    continue
            if self.identity.token and not self.welcomed:
                # Before node 0's proof nothing it says is acted on: an impostor without the
                # token must not start (or stop) this node's trainer.
                raise Refused(
                    f"node 0 at {self.address} sent {message.kind} before proving that it "
                    "holds this job's ENTRYPOINT_JOB_TOKEN (no welcome): it is not this "
                    "job's node 0. Check MASTER_ADDR and give every node the same token"
                )
            out.append(message)
        return out

    def _check_welcome(self, welcome: m.Welcome) -> None:
        token, challenge = self.identity.token, self.challenge
        if token and (
            challenge is None
            or not m.same(
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


def _checked(message: m.Message) -> bytes:
    """The message's line, checked as node 0 will check it. A message this node's own bug
    made unacceptable goes as it is: node 0 skips the line and logs why; this node goes on."""
    try:
        line = m.encode(message)
    except (TypeError, ValueError):  # a value JSON cannot hold
        return (json.dumps(message.to_wire(), default=str) + "\n").encode()
    try:
        return m.encode(m.decode(line, m.FROM_NODES))
    except m.BadMessage:
        return line


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


def _challenge(sock: socket.socket, address: str, wait: float, token: bool = False) -> m.Challenge:
    """Node 0's first line on a new connection. OSError when the connection ends first (node
    0 full, or starting); PeersError when what answers is not an entrypoint; Refused when
    this node holds a token (`token`) and node 0 says it uses none."""
    lines, end = Lines(), time.monotonic() + wait
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
            if token and challenge.auth != m.AUTH_HMAC:
                # This node's proof would go to a peer that says it has no token: never sent.
                raise Refused(
                    f"node 0 at {address} runs without a job token, this node has one "
                    "(ENTRYPOINT_JOB_TOKEN): give every node the same token, or none"
                )
            return challenge
    raise PeersError(
        f"what answers at {address} is not node 0's entrypoint, or not one of "
        f"this version (no challenge "
        f"within {wait:g} s): check MASTER_ADDR and ENTRYPOINT_CONTROL_PORT"
    )


QUICK_RETRY, QUICK_FOR = 0.1, 5.0  # seconds between tries at first, and for how long


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
    setting: float | None = None,
) -> Channel:
    """Connect to node 0's control port, waiting for it in any start order (bounded by
    `timeout`, the time left), and take its challenge. `setting`: ENTRYPOINT_JOIN_TIMEOUT as
    given, which the messages name (the time left is less once the node has done anything)."""
    named = timeout if setting is None else setting
    start = time.monotonic()
    deadline = start + timeout
    delay, next_progress, why = QUICK_RETRY, start + progress_every, "not tried"
    where = host_port(host, port)
    while True:
        try:
            # Every address the name has, IPv6 and IPv4 in turn, each briefly.
            sock = sockets.connect(host, port, min(15.0, max(0.5, deadline - time.monotonic())))
            try:
                challenge = _challenge(sock, where, challenge_wait, bool(identity.token))
            except BaseException:
                sock.close()
                raise
            return Channel(sock, where, identity, challenge)
        except OSError as err:
            why = _why(err)
        now = time.monotonic()
        if now >= deadline:
            raise PeersError(
                f"node 0's entrypoint at {where} did not answer within {now - start:.0f} s "
                f"(ENTRYPOINT_JOIN_TIMEOUT={named:g}); last try: {why}. Likely causes: node 0 "
                "did not start or failed (see its log), MASTER_ADDR is not node 0's address, or "
                "a firewall or network policy blocks the port between nodes"
            )
        if now >= next_progress:
            log(
                f"waiting for node 0 at {where}: {why}; {now - start:.0f} s so far, giving "
                f"up after {timeout:.0f} s"
            )
            next_progress = now + progress_every
        sleep(min(delay, max(0.0, deadline - now)))
        # Every 0.1 s while the nodes start together (node 0 listens within a second or two
        # of its start: each try later is time lost by every node), then backing off.
        delay = QUICK_RETRY if now - start < QUICK_FOR else min(max(delay * 2, 0.25), 5.0)
