"""The field checks behind entrypoint.control.messages: every value that arrives from the network is
checked for its type and range here (exit codes 0-255, signals this system knows, finite
numbers, bounded strings and lists), and the rows of a rank's stack, before anything else
reads them; the nested records (a fingerprint, a beat's figures, a failure) check themselves
with these in their own `from_wire` (node_fingerprint, node_stats, rank_records). A bad field
raises `BadMessage` saying what is wrong."""

from __future__ import annotations

import math
import signal
from typing import Any, overload

from entrypoint.plan.errors import EXIT_PEERS, EntrypointError

MAX_MEMBER = 1 << 20  # absolute bound; the job's own range is the Conductor's to check
KNOWN_SIGNALS = frozenset(int(s) for s in signal.valid_signals() if 0 < int(s) < 128)


class BadMessage(EntrypointError, ValueError):
    """A line that is not a valid control message; the text says what is wrong."""

    exit_code = EXIT_PEERS


# -- field checks ---------------------------------------------------------------------------


def int_field(raw: dict, key: str, lo: int, hi: int, default: Any = ...) -> int:
    value = raw.get(key, default)
    if value is ...:
        raise BadMessage(f"{key} missing")
    if value is None and default is None:
        return None  # type: ignore[return-value]
    if type(value) is not int or not lo <= value <= hi:  # bool is not an int here
        raise BadMessage(f"{key} must be an integer {lo}-{hi}, got {short(value)}")
    return value


def float_field(raw: dict, key: str, default: Any = ...) -> float:
    value = raw.get(key, default)
    if value is ...:
        raise BadMessage(f"{key} missing")
    if value is None and default is None:
        return None  # type: ignore[return-value]
    if type(value) not in (int, float) or not math.isfinite(value):
        raise BadMessage(f"{key} must be a finite number, got {short(value)}")
    return float(value)


def bool_field(raw: dict, key: str, default: Any = ...) -> bool:
    value = raw.get(key, default)
    if value is ...:
        raise BadMessage(f"{key} missing")
    if type(value) is not bool:
        raise BadMessage(f"{key} must be true or false, got {short(value)}")
    return value


def str_field(raw: dict, key: str, limit: int = 256, default: Any = ...) -> str:
    value = raw.get(key, default)
    if value is ...:
        raise BadMessage(f"{key} missing")
    if value is None and default is None:
        return None  # type: ignore[return-value]
    if type(value) is not str or len(value) > limit:
        raise BadMessage(
            f"{key} must be a string of at most {limit} characters, got {short(value)}"
        )
    return value


def hex_field(raw: dict, key: str, length: int, allow_empty: bool = False) -> str:
    value = str_field(raw, key, length, "" if allow_empty else ...)
    if (value or not allow_empty) and (
        len(value) != length or any(c not in "0123456789abcdef" for c in value)
    ):
        raise BadMessage(f"{key} must be {length} lowercase hex digits")
    return value


def strings_field(raw: dict, key: str, count: int, limit: int) -> tuple[str, ...]:
    value = raw.get(key, [])
    if (
        type(value) is not list
        or len(value) > count
        or any(type(v) is not str or len(v) > limit for v in value)
    ):
        raise BadMessage(f"{key} must be a list of at most {count} strings")
    return tuple(value)


@overload
def signal_field(raw: dict, key: str) -> int: ...
@overload
def signal_field(raw: dict, key: str, default: None) -> int | None: ...
def signal_field(raw: dict, key: str, default: Any = ...) -> int | None:
    value = int_field(raw, key, 1, 127, default)
    if value is not None and value not in KNOWN_SIGNALS:
        raise BadMessage(f"{key} {value} is not a signal this system knows")
    return value


def shown(value: str, limit: int = 80) -> str:
    """A string a peer gave, for a log line: as it is when printable, else repr-escaped (a
    newline, a carriage return or an escape code cannot start a fake line or repaint the
    terminal); at most `limit` characters either way."""
    text = value if value.isprintable() else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- the fingerprint and the stats a beat carries ---------------------------------------------


MAX_RANKS = 4096  # ranks one beat reports: a node of 256 GPUs has 256
MAX_FRAMES = 40  # frames of one rank's stack sent to node 0
MAX_TIMEOUT = 1e9  # seconds of a process group's timeout (torch's own are 600 and 1800)


def check_ranks(raw: Any) -> tuple[tuple, ...] | None:
    """A beat's ranks: [rank, steps, age, lead or null, longest, saving(, evaluated(,
    timeout)))] each: `evaluated`, seconds since the rank's last forward pass in evaluation
    (null: none; left out when the rank ran none and has no timeout), `timeout`, its default
    process group's collective timeout in seconds, once known."""
    if raw is None:
        return None
    if type(raw) is not list or len(raw) > MAX_RANKS:
        raise BadMessage(f"ranks must be a list of at most {MAX_RANKS}")
    out = []
    for r in raw:
        if type(r) is not list or len(r) not in (6, 7, 8):
            raise BadMessage("each of ranks must be a list of 6 to 8")
        names = ("rank", "steps", "age", "lead", "longest", "saving", "evaluated", "timeout")
        fields = dict(zip(names, r, strict=False))
        checked: tuple = (
            int_field(fields, "rank", -1, 1 << 30),
            int_field(fields, "steps", 0, 1 << 62),
            max(0.0, float_field(fields, "age")),
            None if fields["lead"] is None else max(0.0, float_field(fields, "lead")),
            max(0.0, float_field(fields, "longest")),
            int_field(fields, "saving", 0, 1),
        )
        if len(r) == 7 or (len(r) == 8 and fields["evaluated"] is not None):
            checked += (max(0.0, float_field(fields, "evaluated")),)
        elif len(r) == 8:
            checked += (None,)
        if len(r) == 8:
            timeout = float_field(fields, "timeout")
            if not 0 < timeout <= MAX_TIMEOUT:
                raise BadMessage(f"timeout must be above 0 and at most {MAX_TIMEOUT:g}")
            checked += (timeout,)
        out.append(checked)
    return tuple(out)


def check_frames(raw: Any) -> list[tuple[str, int, str, str]]:
    """A rank's main-thread stack, innermost first: [[file, line, function, source], ...]."""
    return [  # a peer's words, logged by node 0: escaped
        (
            shown(str_field(parts, "file", 1024), 1024),
            int_field(parts, "line", 0, 1 << 30),
            shown(str_field(parts, "function", 256), 256),
            shown(str_field(parts, "source", 512), 512),
        )
        for parts in rows(raw, ("file", "line", "function", "source"), "frame", MAX_FRAMES)
    ]


MAX_GROUPS = 16  # process groups per rank in a stacks answer
COLLECTIVE_FIELDS = ("group", "description", "seq", "op", "detail")
COLLECTIVE_TEXT = {"group": 64, "description": 128, "op": 128, "detail": 128}  # characters


def check_collectives(raw: Any) -> list[tuple[str, str, int, str, str]]:
    """A rank's process groups' last collectives, as its Flight Recorder holds them:
    [[group id, group description, sequence number, operation, sizes and types], ...]."""

    def text(parts: dict, key: str) -> str:
        return shown(str_field(parts, key, COLLECTIVE_TEXT[key]), COLLECTIVE_TEXT[key])

    return [  # a peer's words, logged by node 0: escaped
        (
            text(parts, "group"),
            text(parts, "description"),
            int_field(parts, "seq", 0, 1 << 62),
            text(parts, "op"),
            text(parts, "detail"),
        )
        for parts in rows(raw, COLLECTIVE_FIELDS, "collective", MAX_GROUPS)
    ]


def rows(raw: Any, fields: tuple[str, ...], what: str, limit: int) -> list[dict]:
    """`raw`, a list of at most `limit` lists of one value per field, as one dict per list."""
    if type(raw) is not list or len(raw) > limit:
        raise BadMessage(f"{what}s must be a list of at most {limit}")
    rows = []
    for item in raw:
        if type(item) is not list or len(item) != len(fields):
            raise BadMessage(f"each {what} must be [{', '.join(fields)}]")
        rows.append(dict(zip(fields, item, strict=True)))
    return rows
