"""SLURM hostlists, expanded fully: `node[01-03,07],gpu-[1-2]-ib[0-1]` -> every host, in order.

Follows SLURM's own expansion (src/common/hostlist.c; `scontrol show hostnames`): a range's
lower bound fixes the zero-padded width, several bracket sets multiply out left to right, and
commas inside brackets separate ranges, not hosts. Anything else is refused.

Bounded: the number of hosts a list names is counted from its ranges before anything is
expanded, and a list of more than `limit` hosts (values.NODES) is refused, so that
`node[0-999999999]` costs nothing. A host named twice is refused too: node ranks are positions.
"""

from __future__ import annotations

import itertools
import math

from entrypoint.plan.errors import ConfigError, EntrypointError
from entrypoint.plan.values import NODES

_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_MAX_DIGITS = 9  # SLURM's own numeric suffixes are far shorter


class HostlistError(EntrypointError, ValueError):
    """A hostlist that cannot be expanded: what is wrong with it (the caller names the
    variable, as a ConfigError)."""


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError("nested '['")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError("']' without '['")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise HostlistError("'[' without ']'")
    parts.append(text[start:])
    return parts


def _digits(text: str, item: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > _MAX_DIGITS:
        raise HostlistError(f"bad range {item!r}")
    return int(text)


# A bracket set as parsed: (low, high, zero-padded width) per range.
Ranges = list[tuple[int, int, int]]


def _parse_ranges(body: str) -> Ranges:
    """`01-03,07` -> [(1, 3, 2), (7, 7, 2)]."""
    out: Ranges = []
    for item in body.split(","):
        low_text, dash, high_text = item.partition("-")
        low = _digits(low_text, item)
        high = _digits(high_text, item) if dash else low
        if high < low:
            raise HostlistError(f"range {item!r} runs backwards")
        padded = low_text.startswith("0") or (dash and len(low_text) == len(high_text))
        out.append((low, high, len(low_text) if padded else 0))
    return out


def _parse_one(expr: str) -> list[str | Ranges]:
    """One host expression: literals and bracket sets, left to right."""
    if not expr:
        raise HostlistError("empty host name")
    pieces: list[str | Ranges] = []
    rest = expr
    while rest:
        open_at = rest.find("[")
        literal = rest if open_at < 0 else rest[:open_at]
        if set(literal) - _HOST_CHARS:
            raise HostlistError(f"bad character in {literal!r}")
        pieces.append(literal)
        if open_at < 0:
            break
        close_at = rest.index("]", open_at)
        pieces.append(_parse_ranges(rest[open_at + 1 : close_at]))
        rest = rest[close_at + 1 :]
    return pieces


def _size(pieces: list[str | Ranges]) -> int:
    return math.prod(
        sum(high - low + 1 for low, high, _ in piece)
        for piece in pieces
        if not isinstance(piece, str)
    )


def _expand(pieces: list[str | Ranges]) -> list[str]:
    choices = [
        [piece]
        if isinstance(piece, str)
        else [str(n).zfill(width) for low, high, width in piece for n in range(low, high + 1)]
        for piece in pieces
    ]
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand(hostlist: str, limit: int = NODES.high) -> list[str]:
    """Every host in a SLURM hostlist, in SLURM's order. Raises HostlistError if malformed,
    if it names more than `limit` hosts (counted before expanding) or names a host twice."""
    text = hostlist.strip()
    if not text:
        raise HostlistError("empty hostlist")
    parsed = [_parse_one(expr.strip()) for expr in _split_top_level(text)]
    total = sum(_size(pieces) for pieces in parsed)
    if total > limit:
        raise HostlistError(f"names {total} hosts, above the limit of {limit}")
    hosts = [host for pieces in parsed for host in _expand(pieces)]
    seen: set[str] = set()
    for host in hosts:
        if host in seen:
            raise HostlistError(f"names {host} twice")
        seen.add(host)
    return hosts


def expand_var(name: str, raw: str, limit: int = NODES.high) -> list[str]:
    """expand(), with the user-facing one-line error naming the variable."""
    try:
        return expand(raw, limit)
    except HostlistError as err:
        raise ConfigError(
            name,
            raw,
            f"not a valid SLURM hostlist ({err})",
            f"Pass the node list as SLURM sets it, e.g. node[01-04] or a,b,c, at most "
            f"{limit} hosts",
        ) from None
