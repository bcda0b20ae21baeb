"""The one reader of a file a variable names (a config directory's JSON, the job's token file):
a regular file only, never more than a limit read, JSON of bounded nesting and numbers.

A named pipe would block the node, /dev/zero would fill its memory, a deepspeed.json nested
10,000 deep or holding a 400-digit number would raise far from where it was read: each is
refused here in one line naming the variable, the file and the fix.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from entrypoint.plan.errors import ConfigError

MAX_JSON = 1 << 20  # bytes of a JSON config file: the shipped ones hold under 2 kB
MAX_TOKEN = 4096  # bytes of a token file: a token is 16 to a few hundred characters
MAX_DEPTH = 64  # nesting of JSON arrays and objects: DeepSpeed's configs nest 3 deep
MAX_NUMBER = 10**15  # magnitude of a JSON number: bucket sizes and steps stay far below it
MAX_DIGITS = 20  # characters of a JSON number, its sign, point and exponent included

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _named(path: Path, value: str) -> str:
    """How a problem names the file: by name when the value shown is its directory."""
    return path.name if value != str(path) else "the file"


def read_bounded(
    path: Path, limit: int, variable: str, fix: str, *, value: str | None = None
) -> bytes:
    """The bytes of the regular file at path, at most limit of them; else one ConfigError
    line for `variable=value` (the path itself unless given). Never blocks on a named pipe."""
    shown = str(path) if value is None else value
    name = _named(path, shown)
    try:
        # O_NONBLOCK: opening a named pipe returns at once instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError(variable, shown, f"{name} cannot be read ({err.strerror})", fix) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((what for test, what in _KINDS if test(mode)), "of another kind")
            raise ConfigError(variable, shown, f"{name} is {kind}, not a regular file", fix)
        data = _read_at_most(fd, limit + 1)
    except OSError as err:
        raise ConfigError(variable, shown, f"{name} cannot be read ({err.strerror})", fix) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ConfigError(variable, shown, f"{name} is larger than {limit:,} bytes", fix)
    return data


def _read_at_most(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def load_json(
    path: Path, variable: str, fix: str, *, value: str | None = None, limit: int = MAX_JSON
) -> object:
    """The JSON value in the file at path, read by read_bounded, of at most MAX_DEPTH levels
    of nesting and numbers within MAX_NUMBER; else one ConfigError line."""
    shown = str(path) if value is None else value
    name = _named(path, shown)

    def refuse(problem: str) -> ConfigError:
        return ConfigError(variable, shown, f"{name} {problem}", fix)

    def number(text: str) -> int | float:
        if len(text) > MAX_DIGITS:
            raise refuse(f"holds a number of {len(text)} characters ({text[:24]}...)")
        parsed = float(text) if any(c in text for c in ".eE") else int(text)
        if not math.isfinite(parsed) or abs(parsed) > MAX_NUMBER:
            raise refuse(f"holds the number {text}, beyond the limit of 10**15")
        return parsed

    def constant(text: str) -> float:
        raise refuse(f"holds {text}, which is not JSON")

    data = read_bounded(path, limit, variable, fix, value=shown)
    try:
        text = data.decode("utf-8")
        parsed = json.loads(text, parse_int=number, parse_float=number, parse_constant=constant)
    except UnicodeDecodeError:
        raise refuse("is not UTF-8 text") from None
    except RecursionError:
        raise refuse(f"nests arrays or objects deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        raise refuse(f"is not valid JSON ({err})") from None
    if _depth(parsed) > MAX_DEPTH:
        raise refuse(f"nests arrays or objects deeper than {MAX_DEPTH} levels")
    return parsed


def _depth(value: object) -> int:
    """How deep arrays and objects nest in a parsed JSON value; iterative, so any depth."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest
