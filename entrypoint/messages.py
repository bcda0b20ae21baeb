"""The control channel's messages: one frozen dataclass each, and the one place that knows the
wire format (JSON, one object per line).

`decode` turns one line into a typed message or raises `BadMessage` with what is wrong: every
field is checked for its type and range (exit codes 0-255, signals this system knows, finite
numbers, bounded strings and lists) before node 0's Conductor or a node's supervisor sees it.
Nothing that arrives from the network is trusted further than this.

    node -> node 0:  hello, beat, exit, signal
    node 0 -> node:  challenge, welcome, refuse, go, stop, restart, signal, beat, done

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
import math
import signal as _signal
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, overload

PROTOCOL = 2
MAX_LINE = 1 << 20  # a hello with every package listed is 10-20 kB; nothing needs more
MAX_MEMBER = 1 << 20  # absolute bound; the job's own range is the Conductor's to check
AUTH_NONE, AUTH_HMAC = "none", "hmac-sha256"
KNOWN_SIGNALS = frozenset(int(s) for s in _signal.valid_signals() if 0 < int(s) < 128)


class BadMessage(ValueError):
    """A line that is not a valid control message; the text says what is wrong."""


# -- field checks ---------------------------------------------------------------------------


def _int(raw: dict, key: str, lo: int, hi: int, default: Any = ...) -> int:
    value = raw.get(key, default)
    if value is ...:
        raise BadMessage(f"{key} missing")
    if value is None and default is None:
        return None  # type: ignore[return-value]
    if type(value) is not int or not lo <= value <= hi:  # bool is not an int here
        raise BadMessage(f"{key} must be an integer {lo}-{hi}, got {_short(value)}")
    return value


def _float(raw: dict, key: str, default: Any = ...) -> float:
    value = raw.get(key, default)
    if value is ...:
        raise BadMessage(f"{key} missing")
    if value is None and default is None:
        return None  # type: ignore[return-value]
    if type(value) not in (int, float) or not math.isfinite(value):
        raise BadMessage(f"{key} must be a finite number, got {_short(value)}")
    return float(value)


def _str(raw: dict, key: str, limit: int = 256, default: Any = ...) -> str:
    value = raw.get(key, default)
    if value is ...:
        raise BadMessage(f"{key} missing")
    if value is None and default is None:
        return None  # type: ignore[return-value]
    if type(value) is not str or len(value) > limit:
        raise BadMessage(
            f"{key} must be a string of at most {limit} characters, got {_short(value)}"
        )
    return value


def _hex(raw: dict, key: str, length: int, allow_empty: bool = False) -> str:
    value = _str(raw, key, length, "" if allow_empty else ...)
    if (value or not allow_empty) and (
        len(value) != length or any(c not in "0123456789abcdef" for c in value)
    ):
        raise BadMessage(f"{key} must be {length} lowercase hex digits")
    return value


def _strings(raw: dict, key: str, count: int, limit: int) -> tuple[str, ...]:
    value = raw.get(key, [])
    if (
        type(value) is not list
        or len(value) > count
        or any(type(v) is not str or len(v) > limit for v in value)
    ):
        raise BadMessage(f"{key} must be a list of at most {count} strings")
    return tuple(value)


@overload
def _signal_number(raw: dict, key: str) -> int: ...
@overload
def _signal_number(raw: dict, key: str, default: None) -> int | None: ...
def _signal_number(raw: dict, key: str, default: Any = ...) -> int | None:
    value = _int(raw, key, 1, 127, default)
    if value is not None and value not in KNOWN_SIGNALS:
        raise BadMessage(f"{key} {value} is not a signal this system knows")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- the fingerprint and the stats a beat carries ---------------------------------------------

_FP_TEXT = (
    "image_lock",
    "image_revision",
    "python",
    "torch",
    "jax",
    "deepspeed",
    "nccl",
    "gpu_model",
)
LAYOUT_FIELDS = (
    "nnodes",
    "node_rank",
    "nproc_per_node",
    "world_size",
    "master_addr",
    "master_port",
    "launcher",
)


def check_fingerprint(raw: Any) -> dict:
    """A node's fingerprint as node 0 compares it (entrypoint.fingerprint), shape-checked."""
    if type(raw) is not dict:
        raise BadMessage("fingerprint must be an object")
    fp: dict = {key: _str(raw, key, 512) for key in _FP_TEXT}
    driver = raw.get("cuda_driver")
    if driver is not None and (type(driver) is not str or len(driver) > 64):
        raise BadMessage("fingerprint.cuda_driver must be a string or null")
    fp["cuda_driver"] = driver
    fp["gpus_per_node"] = _int(raw, "gpus_per_node", 0, 1 << 16)
    pkgs = raw.get("packages")
    if (
        type(pkgs) is not dict
        or len(pkgs) > 20_000
        or any(
            type(k) is not str or type(v) is not str or len(k) > 256 or len(v) > 256
            for k, v in pkgs.items()
        )
    ):
        raise BadMessage("fingerprint.packages must map at most 20000 names to versions")
    fp["packages"] = pkgs
    data = raw.get("data")
    if data is not None:
        if type(data) is not dict:
            raise BadMessage("fingerprint.data must be an object or null")
        fp["data"] = {"path": _str(data, "path", 4096), "exists": data.get("exists") is True}
        if fp["data"]["exists"]:
            fp["data"] |= {
                "files": _int(data, "files", 0, 1 << 62),
                "bytes": _int(data, "bytes", 0, 1 << 62),
                "partial": data.get("partial") is True,
            }
    else:
        fp["data"] = None
    layout = raw.get("layout")
    if type(layout) is not dict:
        raise BadMessage("fingerprint.layout must be an object")
    fp["layout"] = {
        "nnodes": _int(layout, "nnodes", 1, MAX_MEMBER),
        "node_rank": _int(layout, "node_rank", 0, MAX_MEMBER),
        "nproc_per_node": _int(layout, "nproc_per_node", 1, 1 << 16),
        "world_size": _int(layout, "world_size", 1, 1 << 30),
        "master_addr": _str(layout, "master_addr", 1024),
        "master_port": _int(layout, "master_port", 1, 65535, None),
        "launcher": _str(layout, "launcher", 64),
    }
    return fp


def check_stats(raw: Any) -> dict:
    """GPU utilization and memory (NVML), or the CPU load, as a beat carries them."""
    if raw is None:
        return {}
    if type(raw) is not dict:
        raise BadMessage("stats must be an object")
    if "gpus" in raw:
        gpus = raw["gpus"]
        if type(gpus) is not list or len(gpus) > 1024 or any(type(g) is not dict for g in gpus):
            raise BadMessage("stats.gpus must be a list of at most 1024 objects")
        return {
            "gpus": [
                {
                    "util": _float(g, "util"),
                    "mem_used_mib": _int(g, "mem_used_mib", 0, 1 << 40),
                    "mem_total_mib": _int(g, "mem_total_mib", 0, 1 << 40),
                }
                for g in gpus
            ]
        }
    if "load" in raw:
        return {"load": _float(raw, "load")}
    return {}


def check_failure(raw: Any) -> dict | None:
    """What a node says about its failing rank (entrypoint.failures.failure)."""
    if raw is None:
        return None
    if type(raw) is not dict:
        raise BadMessage("failure must be an object or null")
    return {
        "rank": _int(raw, "rank", 0, 1 << 30, None),
        "local_rank": _int(raw, "local_rank", 0, 1 << 16, None),
        "exitcode": _int(raw, "exitcode", -255, 255, None),
        "tail": list(_strings(raw, "tail", 100, 4096)),
        "time": _float(raw, "time", None),
        "killed": _str(raw, "killed", 1024, "") or "",
    }


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
    fingerprint: dict
    time: float
    node_rank: int = 0
    generation: int = 0
    protocol: int = PROTOCOL
    job: str = ""
    auth: str = AUTH_NONE
    nonce: str = ""
    proof: str = ""

    @classmethod
    def from_wire(cls, raw: dict) -> Hello:
        protocol = _int(raw, "protocol", 0, 1 << 30)
        member = _int(raw, "member", 0, MAX_MEMBER)
        host = _str(raw, "host", 255)
        if protocol != PROTOCOL:  # the rest may be another version's: say so, check no more
            return cls(member, host, {}, 0.0, protocol=protocol)
        auth = _str(raw, "auth", 32)
        if auth not in (AUTH_NONE, AUTH_HMAC):
            raise BadMessage(f"auth must be {AUTH_NONE} or {AUTH_HMAC}")
        return cls(
            member=member,
            host=host,
            fingerprint=check_fingerprint(raw.get("fingerprint")),
            time=_float(raw, "time"),
            node_rank=_int(raw, "node_rank", 0, MAX_MEMBER),
            generation=_int(raw, "generation", 0, 1 << 30),
            protocol=protocol,
            job=_str(raw, "job", 512),
            auth=auth,
            nonce=_hex(raw, "nonce", 32),
            proof=_hex(raw, "proof", 64, allow_empty=True),
        )


@dataclass(frozen=True)
class Beat(Message):
    kind: ClassVar[str] = "beat"
    stats: dict = field(default_factory=dict)

    @classmethod
    def from_wire(cls, raw: dict) -> Beat:
        return cls(check_stats(raw.get("stats")))


@dataclass(frozen=True)
class Exit(Message):
    """A node's launcher ended: its code, the signal that stopped it, the failing rank."""

    kind: ClassVar[str] = "exit"
    code: int
    signal: int | None = None
    failure: dict | None = None
    reason: str | None = None

    @classmethod
    def from_wire(cls, raw: dict) -> Exit:
        return cls(
            code=_int(raw, "code", 0, 255),
            signal=_signal_number(raw, "signal", None),
            failure=check_failure(raw.get("failure")),
            reason=_str(raw, "reason", 4096, None),
        )


@dataclass(frozen=True)
class Signal(Message):
    """A node received a signal (node -> node 0), or node 0 passes it on (with the reason)."""

    kind: ClassVar[str] = "signal"
    signal: int
    reason: str = ""

    @classmethod
    def from_wire(cls, raw: dict) -> Signal:
        return cls(_signal_number(raw, "signal"), _str(raw, "reason", 4096, ""))


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
            nonce=_hex(raw, "nonce", 32),
            job=_str(raw, "job", 512),
            auth=_str(raw, "auth", 32),
            protocol=_int(raw, "protocol", 0, 1 << 30),
        )


@dataclass(frozen=True)
class Welcome(Message):
    kind: ClassVar[str] = "welcome"
    proof: str = ""

    @classmethod
    def from_wire(cls, raw: dict) -> Welcome:
        return cls(_hex(raw, "proof", 64, allow_empty=True))


@dataclass(frozen=True)
class Refuse(Message):
    kind: ClassVar[str] = "refuse"
    reason: str

    @classmethod
    def from_wire(cls, raw: dict) -> Refuse:
        return cls(_str(raw, "reason", 4096))


@dataclass(frozen=True)
class Go(Message):
    kind: ClassVar[str] = "go"
    generation: int = 0
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, raw: dict) -> Go:
        return cls(_int(raw, "generation", 0, 1 << 30), _strings(raw, "warnings", 10_000, 4096))


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
            _int(raw, "code", 0, 255),
            _str(raw, "reason", 1 << 16),
            _signal_number(raw, "signal", None),
        )


@dataclass(frozen=True)
class Restart(Message):
    kind: ClassVar[str] = "restart"
    generation: int
    reason: str = ""

    @classmethod
    def from_wire(cls, raw: dict) -> Restart:
        return cls(_int(raw, "generation", 0, 1 << 30), _str(raw, "reason", 1 << 16, ""))


@dataclass(frozen=True)
class Done(Message):
    kind: ClassVar[str] = "done"

    @classmethod
    def from_wire(cls, raw: dict) -> Done:
        return cls()


KINDS: dict[str, type[Message]] = {
    m.kind: m
    for m in (Hello, Beat, Exit, Signal, Challenge, Welcome, Refuse, Go, Stop, Restart, Done)
}
FROM_NODES = frozenset({"hello", "beat", "exit", "signal"})
FROM_NODE_0 = frozenset(
    {"challenge", "welcome", "refuse", "go", "stop", "restart", "signal", "beat", "done"}
)


def _no_constant(name: str):
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
        raise BadMessage(f"unknown message type {_short(kind)}")
    return KINDS[kind].from_wire(raw)


def from_dict(raw: dict, allowed: frozenset[str] = FROM_NODES) -> Message:
    """A message built in this process as a dict (the wire form), checked the same way."""
    return decode(json.dumps(raw).encode(), allowed)


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
