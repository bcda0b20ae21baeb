"""The control channel's messages: one frozen dataclass each, and the one place that knows the
wire format (JSON, one object per line).

`decode` turns one line into a typed message or raises `BadMessage` with what is wrong: every field
is checked for its type and range (entrypoint.control.message_fields: exit codes 0-255, signals this
system knows, finite numbers, bounded strings and lists) before node 0's Conductor or a node's
supervisor sees it. Nothing that arrives from the network is trusted further than this.

    node -> node 0:  hello, beat, exit, signal, stacks, health
    node 0 -> node:  challenge, welcome, refuse, go, stop, restart, signal, beat, done, dump

The handshake: node 0 sends `challenge` as soon as a connection is accepted (a fresh nonce,
its job identity, whether a token is required); the node answers `hello` carrying its own nonce
and, with ENTRYPOINT_JOB_TOKEN, an HMAC over both nonces, the job and its member id; node 0
answers `welcome` with its own HMAC (so the node knows node 0 holds the token too) or `refuse`
with the reason. The token itself never crosses the wire.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, NoReturn

from entrypoint.control.message_fields import (
    MAX_MEMBER,
    BadMessage,
    check_ranks,
    float_field,
    hex_field,
    int_field,
    short,
    signal_field,
    str_field,
    strings_field,
)
from entrypoint.control.node_fingerprint import Fingerprint
from entrypoint.control.node_stats import NodeStats
from entrypoint.control.rank_records import (
    Failure,
    RankDump,
    RankReport,
    RankStack,
    rank_dumps,
)

PROTOCOL = 2
MAX_LINE = 1 << 20  # a hello with every package listed is 10-20 kB; nothing needs more
_ETCD_MEMBER = re.compile(r"[0-9]{1,6}=[^\s=,]{1,255}")  # a Go's etcd entry: MEMBER=HOST
# Node 0's seat as a new node 0 holds it: "MEMBER HOST HOST:PORT" (its control address)
_HOLDS = re.compile(r"[0-9]{1,6} [^\s]{1,255} [^\s]{1,300}")
STATS_EVERY = 10.0  # seconds: a beat carries the GPU figures at most this often (node 0's CPU)
AUTH_NONE, AUTH_HMAC = "none", "hmac-sha256"


# -- messages -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    kind: ClassVar[str] = ""

    def to_wire(self) -> dict:
        """The message as its JSON object; an optional field that is None is left out."""
        out: dict[str, Any] = {"t": self.kind}
        for key, value in asdict(self).items():
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_wire(cls, raw: dict) -> Message:  # pragma: no cover - every kind overrides it
        raise NotImplementedError


@dataclass(frozen=True)
class Hello(Message):
    """A node joins (and again after a restart): who it is, its fingerprint, its proof."""

    kind: ClassVar[str] = "hello"
    member: int
    host: str
    fingerprint: Fingerprint
    time: float
    node_rank: int = 0
    generation: int = 0
    protocol: int = PROTOCOL
    job: str = ""
    auth: str = AUTH_NONE
    nonce: str = ""
    proof: str = ""
    unhealthy: str = ""  # the checks this node failed before this start (supervise/health.py)
    domain: str = ""  # the NVLink domain of its GPUs (NVML's fabric cluster and clique), or ""
    # Not a join: a node that took node 0's seat, knocking at the lost node 0's address for a
    # node 0 its platform started again there (`holds`: "MEMBER HOST HOST:PORT")
    holds: str = ""

    @classmethod
    def from_wire(cls, raw: dict) -> Hello:
        protocol = int_field(raw, "protocol", 0, 1 << 30)
        member = int_field(raw, "member", 0, MAX_MEMBER)
        host = str_field(raw, "host", 255)
        if protocol != PROTOCOL:  # the rest may be another version's: say so, check no more
            return cls(member, host, Fingerprint(), 0.0, protocol=protocol)
        auth = str_field(raw, "auth", 32)
        if auth not in (AUTH_NONE, AUTH_HMAC):
            raise BadMessage(f"auth must be {AUTH_NONE} or {AUTH_HMAC}")
        return cls(
            member=member,
            host=host,
            fingerprint=Fingerprint.from_wire(raw.get("fingerprint")),
            time=float_field(raw, "time"),
            node_rank=int_field(raw, "node_rank", 0, MAX_MEMBER),
            generation=int_field(raw, "generation", 0, 1 << 30),
            protocol=protocol,
            job=str_field(raw, "job", 512),
            auth=auth,
            nonce=hex_field(raw, "nonce", 32),
            proof=hex_field(raw, "proof", 64, allow_empty=True),
            unhealthy=str_field(raw, "unhealthy", 4096, ""),
            domain=str_field(raw, "domain", 100, ""),
            holds=holds_field(raw),
        )

    def to_wire(self) -> dict:
        wire = super().to_wire() | {"fingerprint": self.fingerprint.to_wire()}
        if not self.holds:
            wire.pop("holds")
        return wire


def holds_field(raw: dict) -> str:
    holds = str_field(raw, "holds", 600, "")
    if holds and not _HOLDS.fullmatch(holds):
        raise BadMessage("holds must be MEMBER HOST HOST:PORT")
    return holds


@dataclass(frozen=True)
class Beat(Message):
    """Alive. From a node: its GPUs' figures (`stats`) and its ranks' progress (`ranks`, each
    `RankReport.to_wire()`: rank, steps, seconds since its last step, mean seconds before
    backward, longest step interval, saving, seconds since its last forward pass in evaluation,
    its process group's timeout)."""

    kind: ClassVar[str] = "beat"
    stats: NodeStats = field(default_factory=NodeStats)
    ranks: tuple[RankReport, ...] | None = None

    @classmethod
    def from_wire(cls, raw: dict) -> Beat:
        checked = check_ranks(raw.get("ranks"))
        ranks = None if checked is None else tuple(RankReport.from_checked(r) for r in checked)
        return cls(NodeStats.from_wire(raw.get("stats")), ranks)

    def to_wire(self) -> dict:
        out: dict[str, Any] = {"t": self.kind, "stats": self.stats.to_wire()}
        if self.ranks is not None:
            out["ranks"] = [r.to_wire() for r in self.ranks]
        return out

    def reports(self) -> list[RankReport]:
        return list(self.ranks or ())


@dataclass(frozen=True)
class Health(Message):
    """A GPU or link event on a node (entrypoint.supervise.health_rules): `kind` is what
    /metrics counts (`xid_79`, `nic_down`), `fatal` takes the node out of the job."""

    kind: ClassVar[str] = "health"
    event: str
    where: str
    text: str
    fatal: bool

    @classmethod
    def from_wire(cls, raw: dict) -> Health:
        event = str_field(raw, "kind", 40)
        if not event.replace("_", "").isalnum():
            raise BadMessage("kind must be letters, digits and _")
        fatal = raw.get("fatal")
        if type(fatal) is not bool:
            raise BadMessage("fatal must be true or false")
        return cls(event, str_field(raw, "where", 200), str_field(raw, "text", 1000), fatal)

    def to_wire(self) -> dict:
        return {
            "t": self.kind,
            "kind": self.event,
            "where": self.where,
            "text": self.text,
            "fatal": self.fatal,
        }


@dataclass(frozen=True)
class Exit(Message):
    """A node's launcher ended: its code, the signal that stopped it, the failing rank."""

    kind: ClassVar[str] = "exit"
    code: int
    signal: int | None = None
    failure: Failure | None = None
    reason: str | None = None

    @classmethod
    def from_wire(cls, raw: dict) -> Exit:
        return cls(
            code=int_field(raw, "code", 0, 255),
            signal=signal_field(raw, "signal", None),
            failure=Failure.from_wire(raw.get("failure")),
            reason=str_field(raw, "reason", 4096, None),
        )


@dataclass(frozen=True)
class Signal(Message):
    """A node received a signal (node -> node 0), or node 0 passes it on (with the reason)."""

    kind: ClassVar[str] = "signal"
    signal: int
    reason: str = ""

    @classmethod
    def from_wire(cls, raw: dict) -> Signal:
        return cls(signal_field(raw, "signal"), str_field(raw, "reason", 4096, ""))


@dataclass(frozen=True)
class Challenge(Message):
    kind: ClassVar[str] = "challenge"
    nonce: str
    job: str
    auth: str
    protocol: int = PROTOCOL

    @classmethod
    def from_wire(cls, raw: dict) -> Challenge:
        return cls(
            nonce=hex_field(raw, "nonce", 32),
            job=str_field(raw, "job", 512),
            auth=str_field(raw, "auth", 32),
            protocol=int_field(raw, "protocol", 0, 1 << 30),
        )


@dataclass(frozen=True)
class Welcome(Message):
    kind: ClassVar[str] = "welcome"
    proof: str = ""

    @classmethod
    def from_wire(cls, raw: dict) -> Welcome:
        return cls(hex_field(raw, "proof", 64, allow_empty=True))


@dataclass(frozen=True)
class Refuse(Message):
    kind: ClassVar[str] = "refuse"
    reason: str

    @classmethod
    def from_wire(cls, raw: dict) -> Refuse:
        return cls(str_field(raw, "reason", 4096))


@dataclass(frozen=True)
class Go(Message):
    """Start the trainer. With spares or shrinking (entrypoint.coordinator.roster), node 0 seats
    each node: `nnodes` is the job's size for this start and `seat` this node's rank in it; a node
    given `nnodes` and no `seat` stands by. Neither: train as the node's own plan says."""

    kind: ClassVar[str] = "go"
    generation: int = 0
    warnings: tuple[str, ...] = ()
    seat: int | None = None
    nnodes: int | None = None
    # The job's own etcd (entrypoint.consensus.embedded): its members as "MEMBER=HOST", in the
    # cluster's order; each member named starts one, every node reads node 0's seat there.
    etcd: tuple[str, ...] = ()

    @property
    def standby(self) -> bool:
        return self.nnodes is not None and self.seat is None

    @classmethod
    def from_wire(cls, raw: dict) -> Go:
        nnodes = int_field(raw, "nnodes", 1, MAX_MEMBER, None)
        seat = int_field(raw, "seat", 0, (nnodes or 1) - 1, None)
        if seat is not None and nnodes is None:
            raise BadMessage("seat without nnodes")
        etcd = strings_field(raw, "etcd", 5, 300)
        if any(not _ETCD_MEMBER.fullmatch(x) for x in etcd):
            raise BadMessage("etcd must list MEMBER=HOST")
        return cls(
            int_field(raw, "generation", 0, 1 << 30),
            strings_field(raw, "warnings", 10_000, 4096),
            seat,
            nnodes,
            etcd,
        )


@dataclass(frozen=True)
class Elsewhere(Message):
    """To a node 0 its platform started again, from its own server: another node holds node 0's
    seat (`holds`: "MEMBER HOST HOST:PORT", as it said in its hello): join it, serve nothing."""

    kind: ClassVar[str] = "elsewhere"
    holds: str

    @classmethod
    def from_wire(cls, raw: dict) -> Elsewhere:
        holds = holds_field(raw)
        if not holds:
            raise BadMessage("holds missing")
        return cls(holds)


@dataclass(frozen=True)
class Stop(Message):
    """The job ends with `code`; `signal`: a node received it, the others pass it on."""

    kind: ClassVar[str] = "stop"
    code: int
    reason: str
    signal: int | None = None

    @classmethod
    def from_wire(cls, raw: dict) -> Stop:
        return cls(
            int_field(raw, "code", 0, 255),
            str_field(raw, "reason", 1 << 16),
            signal_field(raw, "signal", None),
        )


@dataclass(frozen=True)
class Restart(Message):
    kind: ClassVar[str] = "restart"
    generation: int
    reason: str = ""

    @classmethod
    def from_wire(cls, raw: dict) -> Restart:
        return cls(int_field(raw, "generation", 0, 1 << 30), str_field(raw, "reason", 1 << 16, ""))


@dataclass(frozen=True)
class Dump(Message):
    """Node 0 -> every node: no rank has stepped for `silent` seconds; send your ranks' stacks."""

    kind: ClassVar[str] = "dump"
    silent: float = 0.0

    @classmethod
    def from_wire(cls, raw: dict) -> Dump:
        return cls(float_field(raw, "silent", 0.0))


@dataclass(frozen=True)
class Stacks(Message):
    """A node's answer to `dump`: each rank's main-thread stack, innermost frame first (`ranks`:
    objects with rank, steps and frames, each frame [file, line, function, source]), and the last
    collective of each of its process groups that torch's Flight Recorder holds (`collectives`,
    where the rank answered: [group, description, seq, op, detail])."""

    kind: ClassVar[str] = "stacks"
    ranks: tuple[RankDump, ...] = ()

    @classmethod
    def from_wire(cls, raw: dict) -> Stacks:
        return cls(rank_dumps(raw.get("ranks")))

    def to_wire(self) -> dict:
        return {"t": self.kind, "ranks": [r.to_wire() for r in self.ranks]}

    def stacks(self, member: int, host: str) -> list[RankStack]:
        return [r.at(member, host) for r in self.ranks]


@dataclass(frozen=True)
class Done(Message):
    kind: ClassVar[str] = "done"

    @classmethod
    def from_wire(cls, raw: dict) -> Done:
        return cls()


KINDS: dict[str, type[Message]] = {
    m.kind: m
    for m in (
        Hello,
        Beat,
        Exit,
        Signal,
        Challenge,
        Welcome,
        Refuse,
        Go,
        Stop,
        Restart,
        Done,
        Dump,
        Elsewhere,
    )
} | {"stacks": Stacks, "health": Health}
FROM_NODES = frozenset({"hello", "beat", "exit", "signal", "stacks", "health"})
FROM_NODE_0 = frozenset(
    {
        "challenge",
        "welcome",
        "refuse",
        "go",
        "stop",
        "restart",
        "signal",
        "beat",
        "done",
        "dump",
        "elsewhere",
    }
)


def _no_constant(name: str) -> NoReturn:
    raise BadMessage(f"{name} is not a number JSON allows")


def decode(line: bytes, allowed: frozenset[str] = FROM_NODES) -> Message:
    """One line from the wire as a typed message, or BadMessage saying what is wrong."""
    if len(line) > MAX_LINE:
        raise BadMessage(f"line of {len(line)} bytes, more than {MAX_LINE}")
    try:
        raw = json.loads(line, parse_constant=_no_constant)
    except BadMessage:
        raise
    except (ValueError, RecursionError, UnicodeDecodeError) as err:
        raise BadMessage(f"not JSON ({type(err).__name__})") from None
    if type(raw) is not dict:
        raise BadMessage(f"a message is a JSON object, got {type(raw).__name__}")
    kind = raw.get("t")
    if type(kind) is not str or kind not in allowed:
        raise BadMessage(f"unknown message type {short(kind)}")
    return KINDS[kind].from_wire(raw)


def encode(message: Message) -> bytes:
    return (json.dumps(message.to_wire(), separators=(",", ":")) + "\n").encode()


# -- the handshake's proofs -----------------------------------------------------------------


def proof(token: bytes, *parts: str) -> str:
    """HMAC-SHA256 of the parts under the job's token: proves the token without sending it."""
    return hmac.new(token, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def hello_proof(token: bytes, server_nonce: str, nonce: str, job: str, member: int) -> str:
    return proof(token, "entrypoint-hello", server_nonce, nonce, job, str(member))


def welcome_proof(token: bytes, server_nonce: str, nonce: str, job: str, member: int) -> str:
    return proof(token, "entrypoint-welcome", server_nonce, nonce, job, str(member))


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
