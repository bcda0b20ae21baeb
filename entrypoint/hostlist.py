"""SLURM hostlists, expanded fully: `node[01-03,07],gpu-[1-2]-ib[0-1]` -> every host, in order.

Follows SLURM's own expansion (src/common/hostlist.c; `scontrol show hostnames`): a range's
lower bound fixes the zero-padded width, several bracket sets multiply out left to right, and
commas inside brackets separate ranges, not hosts. Anything else is refused.
"""

from __future__ import annotations

import itertools

from entrypoint.errors import ConfigError

_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class HostlistError(ValueError):
    pass


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


def _expand_ranges(body: str) -> list[str]:
    """`01-03,07` -> ['01', '02', '03', '07']."""
    out: list[str] = []
    for item in body.split(","):
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise HostlistError(f"bad range {item!r}")
        if not dash:
            out.append(low)
            continue
        if int(high) < int(low):
            raise HostlistError(f"range {item!r} runs backwards")
        width = len(low) if low.startswith("0") or len(low) == len(high) else 0
        out.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return out


def _expand_one(expr: str) -> list[str]:
    """One host expression with any number of bracket sets."""
    if not expr:
        raise HostlistError("empty host name")
    pieces: list[list[str]] = []
    rest = expr
    while rest:
        open_at = rest.find("[")
        literal = rest if open_at < 0 else rest[:open_at]
        if set(literal) - _HOST_CHARS:
            raise HostlistError(f"bad character in {literal!r}")
        pieces.append([literal])
        if open_at < 0:
            break
        close_at = rest.index("]", open_at)
        pieces.append(_expand_ranges(rest[open_at + 1 : close_at]))
        rest = rest[close_at + 1 :]
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand(hostlist: str) -> list[str]:
    """Every host in a SLURM hostlist, in SLURM's order. Raises HostlistError if malformed."""
    text = hostlist.strip()
    if not text:
        raise HostlistError("empty hostlist")
    hosts: list[str] = []
    for expr in _split_top_level(text):
        hosts.extend(_expand_one(expr.strip()))
    return hosts


def expand_var(name: str, raw: str) -> list[str]:
    """expand(), with the user-facing one-line error naming the variable."""
    try:
        return expand(raw)
    except HostlistError as err:
        raise ConfigError(
            name, raw, f"not a valid SLURM hostlist ({err})",
            "Pass the node list as SLURM sets it, e.g. node[01-04] or a,b,c",
        ) from None
