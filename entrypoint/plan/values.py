"""Values that remember where they came from, and the one strict reader for each kind of value
the entrypoint takes from its environment or command line: numbers, host addresses, device
lists (hostlists: entrypoint.plan.hostlist). Every refusal is one ConfigError line:
`VARIABLE=value: what is wrong. What to do.`

Numbers are ASCII digits only (no sign, no `²`, no `1_000`), bounded by a stated limit checked
before anything is built from them, so that no value can make a plan slow or huge.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, NoReturn, TypeVar
from urllib.parse import urlsplit

from entrypoint.plan.errors import ConfigError

PREFIX = "ENTRYPOINT_"  # the entrypoint's own settings' variables (entrypoint.plan.settings)

T = TypeVar("T")


class Kind(StrEnum):
    """What decided a value."""

    ENV = "env"  # a variable, read as it is (ENTRYPOINT_* settings included)
    DEFAULT = "default"  # nothing said: the entrypoint's default
    PROBE = "probe"  # this node's hardware or network, as probed
    DERIVED = "derived"  # computed from other values; `detail` says how
    COMMAND = "command"  # the command line


@dataclass(frozen=True)
class Source:
    """Where a decided value came from, as a typed value: its kind, the variable an error line
    names (None when no one variable decided it), and the detail. `str()` is the text that
    `plan` and the logs show: `env SLURM_NNODES`, `env RANK (as node index)`, `default 1 on
    CPU`, `count of hosts in SLURM_NODELIST`."""

    kind: Kind
    variable: str | None = None
    detail: str = ""

    def __str__(self) -> str:
        if self.kind is Kind.ENV:
            head = f"env {self.variable}" if self.variable else "env"
            # `=value` and `: why` follow the variable; a note in parentheses, after a space
            joined = self.detail[:1] in ("=", ":")
            return head + ("" if joined or not self.detail else " ") + self.detail
        return self.detail

    def names(self, fallback: str) -> str:
        """The variable an error line names: this source's, else `fallback`."""
        return self.variable or fallback


def env_var(variable: str, detail: str = "") -> Source:
    """Read from `variable`; `detail` (in parentheses) says how it was read, if not as is."""
    return Source(Kind.ENV, variable, detail)


def by_default(detail: str, variable: str | None = None) -> Source:
    """The entrypoint's default; `variable`: the one that was unset, when one was."""
    return Source(Kind.DEFAULT, variable, detail)


def probed(detail: str) -> Source:
    return Source(Kind.PROBE, None, detail)


def derived(detail: str, variable: str | None = None) -> Source:
    """Computed from other values; `variable`: the one an error about it names."""
    return Source(Kind.DERIVED, variable, detail)


def from_command(detail: str) -> Source:
    return Source(Kind.COMMAND, None, detail)


@dataclass(frozen=True)
class Sourced(Generic[T]):
    """A decided value and where it came from."""

    value: T
    source: Source


@dataclass(frozen=True)
class Limit:
    """The largest value a kind of count may take, and its name in messages."""

    noun: str
    high: int


# The bounds (docs/errors.md). Far above any job run today, low enough that nothing built
# from them (host lists, device lists, rank tables) can take memory or time.
NODES = Limit("nodes", 65536)
PROCESSES = Limit("processes", 1 << 20)  # a world size; global ranks are below it
PER_NODE = Limit("processes per node", 1024)  # CPU workers may outnumber GPUs
GPUS = Limit("GPUs per node", 256)  # as `render` allows; 8 GPUs x 8 partitions = 64 today
PORTS = Limit("port", 65535)
_MAX_DIGITS = 18  # checked before int(): Python refuses over 4300 digits with a traceback


def _empty(name: str, raw: str) -> ConfigError:
    return ConfigError(name, raw, "is set but empty", f"Give {name} a value, or unset it")


def number(
    name: str, raw: str | None, *, low: int, high: int, noun: str = "", example: int | None = None
) -> int:
    """A whole number low..high written in ASCII digits, else one line naming the range."""
    example = low if example is None else example
    unit = f" {noun}" if noun else ""
    if raw is None:
        raise ConfigError(
            name,
            None,
            "is not set",
            f"Set {name} to a whole number from {low} to {high}, for example {example}",
        )
    text = raw.strip()
    if not text:
        raise _empty(name, raw)
    if not (text.isascii() and text.isdigit()):
        what = "a positive whole number" if low >= 1 else "a whole number"
        raise ConfigError(
            name,
            raw,
            f"not {what} (ASCII digits 0-9 only, no sign)",
            f"Set {name} to a number from {low} to {high}, for example {example}",
        )
    significant = text.lstrip("0") or "0"  # int() refuses 4300 digits, zeros included
    if len(significant) > _MAX_DIGITS or int(significant) > high:
        raise ConfigError(
            name,
            raw,
            f"is above the limit of {high}{unit}",
            f"Set {name} to a number from {low} to {high}",
        )
    value = int(significant)
    if value < low:
        problem = "not a positive whole number" if low == 1 else f"is below {low}"
        raise ConfigError(
            name,
            raw,
            problem,
            f"Set {name} to a number from {low} to {high}, for example {example}",
        )
    return value


def count(name: str, raw: str | None, limit: Limit, *, allow_zero: bool = False) -> int:
    """A count of nodes, processes or GPUs: 1 (or 0) up to the limit."""
    return number(
        name, raw, low=0 if allow_zero else 1, high=limit.high, noun=limit.noun, example=2
    )


def index(name: str, raw: str | None, limit: Limit = PROCESSES) -> int:
    """A 0-based index (rank, node rank) below the limit; `below` then checks it in the job."""
    return number(name, raw, low=0, high=limit.high - 1, example=0)


def port(name: str, raw: str | None) -> int:
    try:
        return number(name, raw, low=1, high=PORTS.high, example=29500)
    except ConfigError:
        if raw is None or not raw.strip():
            raise
        raise ConfigError(
            name,
            raw,
            "not a TCP port (a number from 1 to 65535, ASCII digits)",
            f"Set {name} to a free port such as 29500",
        ) from None


def first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of `names` that is set, as (name, stripped value). A platform's variable set
    but empty is refused (WORLD_SIZE='' is not "unset"); an empty ENTRYPOINT_* setting is unset,
    as in entrypoint.plan.settings."""
    for name in names:
        raw = env.get(name)
        if raw is None:
            continue
        if raw.strip():
            return name, raw.strip()
        if not name.startswith("ENTRYPOINT_"):
            raise _empty(name, raw)
    return None


def below(rank_name: str, rank: int, size_name: str, size: int) -> None:
    if rank >= size:
        raise ConfigError(
            rank_name,
            rank,
            f"must be below {size_name}={size} (ranks count from 0)",
            f"Give each node a {rank_name} from 0 to {size - 1}, or fix {size_name}",
        )


# -- host addresses ---------------------------------------------------------------------------

_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
# A zone is this node's interface name (at most 15 characters in Linux) or its index.
_ZONE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")


def _host_fix(name: str) -> str:
    return f"Set {name} to one host name or IP address, such as worker-0, 10.0.0.1 or fd00::2"


def _port_in_host(name: str, raw: str, text: str) -> NoReturn:
    head, _, tail = text.rpartition(":")
    raise ConfigError(
        name,
        raw,
        "holds a port (host:port)",
        f"Set {name}={head.removeprefix('[').removesuffix(']')} and the port in MASTER_PORT={tail}",
    )


def _ipv6(name: str, raw: str, text: str, inner: str, master: bool) -> str:
    """An IPv6 address (`inner`: without brackets) in its compressed form, a zone kept on a
    link-local one, or the one line saying what is wrong."""
    bare, percent, zone = inner.partition("%")
    try:
        address = ipaddress.IPv6Address(bare)
    except ValueError:
        address = None
    if address is None and text.startswith("[") and "]:" in text:
        _port_in_host(name, raw, text)
    if address is None:
        raise ConfigError(
            name,
            raw,
            "not a valid IPv6 address (with a port it would be "
            "[address]:port, and the port belongs in MASTER_PORT)",
            _host_fix(name),
        )
    if address.ipv4_mapped is not None and not percent:
        return str(address.ipv4_mapped)
    if percent and not (address.is_link_local and _ZONE.match(zone)):
        raise ConfigError(
            name,
            raw,
            "a zone (%interface) belongs on a link-local address (fe80::/10) only, as one "
            "interface name",
            f"Set {name}={address}" if not address.is_link_local else _host_fix(name),
        )
    if master and address.is_link_local and not percent:
        raise ConfigError(
            name,
            raw,
            "a link-local address without its zone (the interface that reaches it)",
            f"Set {name}={address}%eth0 (this node's interface towards node 0), or give "
            "node 0's global or unique-local address",
        )
    return f"{address}%{zone}" if percent else str(address)


def host(name: str, raw: str | None, *, master: bool = True) -> str:
    """One host: a name (RFC 1123 labels, `_` allowed), an IPv4 address, or an IPv6 address
    with or without brackets, returned without them (`fd00::2`, `fe80::1%eth0`). `host:port`,
    URLs, spaces, lists and non-ASCII text are refused with the fix; so is a link-local address
    without its zone where this node connects to it (`master`)."""
    if raw is None:
        raise ConfigError(name, None, "is not set", _host_fix(name))
    text = raw.strip()
    if not text:
        raise _empty(name, raw)
    if not text.isascii() or not text.isprintable():
        raise ConfigError(
            name,
            raw,
            "not a host name (characters outside ASCII letters, digits, '-', '_' and '.')",
            _host_fix(name),
        )
    if "://" in text:
        raise ConfigError(name, raw, "a URL, not a host", _host_fix(name))
    if any(c in text for c in " \t,;/@"):
        raise ConfigError(
            name, raw, "not one host name (it holds a space, comma or '/')", _host_fix(name)
        )
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if inner.count(":") >= 2:
        return _ipv6(name, raw, text, inner, master)
    if ":" in text:
        _port_in_host(name, raw, text)
    if "[" in text or "]" in text:
        raise ConfigError(name, raw, "brackets belong around IPv6 addresses only", _host_fix(name))
    labels = text.removesuffix(".").split(".")
    if all(label.isdigit() for label in labels):
        try:
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            raise ConfigError(
                name,
                raw,
                "not a valid IPv4 address (four numbers 0-255, no leading zeros)",
                _host_fix(name),
            ) from None
    if len(text) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ConfigError(
            name,
            raw,
            "not a valid host name (labels of letters, digits, '-' and "
            "'_', at most 63 each, not starting or ending with '-')",
            _host_fix(name),
        )
    return text


def host_port(address: str, port_number: int | str) -> str:
    """`host:port`, with brackets around an IPv6 address (`[::1]:29500`, `[::1]:auto`)."""
    return f"[{address}]:{port_number}" if ":" in address else f"{address}:{port_number}"


# -- device lists -----------------------------------------------------------------------------

_UUID = re.compile(r"^(GPU|MIG)-[A-Za-z0-9/-]{1,120}$")


def device_list(name: str, raw: str) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: `''` hides every GPU (an empty tuple), so does a
    leading negative index; else indices (ASCII digits, below GPUS.high; `02` read as 2) or
    UUIDs (`GPU-...`, `MIG-...`), kept as written. Duplicates, empty entries, words and later
    negatives, which CUDA would read as "stop here" without a word, are refused."""
    text = raw.strip()
    if not text:
        return ()
    entries = [entry.strip() for entry in text.split(",")]
    if entries[0].startswith("-") and entries[0][1:].isascii() and entries[0][1:].isdigit():
        return ()
    fix = (
        f"List this node's GPUs once each, by index (0,1,2) or UUID (GPU-...), or unset "
        f"{name} to use them all"
    )
    seen: set[str] = set()
    ids = []
    for entry in entries:
        if not entry:
            raise ConfigError(name, raw, "has an empty entry", fix)
        if entry.isascii() and entry.isdigit():
            key = str(number(name, entry, low=0, high=GPUS.high - 1))  # `02` is GPU 2 to CUDA
        elif _UUID.match(entry):
            key = entry
        elif entry == "all":
            raise ConfigError(
                name,
                raw,
                "CUDA reads 'all' as no GPU at all (NVIDIA_VISIBLE_"
                "DEVICES=all is the container runtime's word, not CUDA's)",
                f"Unset {name} to use every GPU",
            )
        else:
            raise ConfigError(
                name,
                raw,
                f"names {entry!r}, neither a GPU index nor a UUID "
                "(CUDA silently stops reading the list there)",
                fix,
            )
        if key in seen:
            raise ConfigError(name, raw, f"names GPU {entry} twice", fix)
        seen.add(key)
        ids.append(key)
    return tuple(ids)


ETCD_OFF = "off"  # ENTRYPOINT_ETCD=off: no etcd, not even the job's own


def endpoints_from(text: str) -> tuple[tuple[str, int], ...]:
    """`http://a:2379,http://b:2379` (etcdctl's --endpoints), `https://...` or `a:2379,b:2379`:
    (host, port) pairs. ValueError names the entry that is not one, or says the entries mix
    http and https (`etcd_https` tells which they are)."""
    found = []
    for entry in (x.strip() for x in text.split(",")):
        if not entry:
            continue
        url = urlsplit(entry if "://" in entry else f"http://{entry}")
        if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/"):
            raise ValueError(f"{entry!r} is not http://HOST:PORT or https://HOST:PORT")
        try:
            port = url.port or 2379
        except ValueError:
            raise ValueError(f"{entry!r} has no port number") from None
        found.append((url.hostname, port))
    if not found:
        raise ValueError("no endpoint given")
    etcd_https(text)
    return tuple(found)


def etcd_https(text: str) -> bool | None:
    """Whether etcd's endpoints say https (True), http (False), or neither (None: HOST:PORT
    alone). ValueError where they mix the two (one etcd speaks one or the other)."""
    schemes = {e.strip().partition("://")[0].lower() for e in text.split(",") if "://" in e}
    if len(schemes) > 1:
        raise ValueError("the endpoints mix http:// and https:// (one etcd serves one of them)")
    return None if not schemes else schemes == {"https"}
