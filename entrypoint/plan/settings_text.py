"""The text of an ENTRYPOINT_* setting, checked before pydantic parses it: numbers in plain
ASCII digits within the field's own range, paths Linux can hold, the master one host, nothing
on two lines. Each refusal is the one-line error naming the variable, its value and the fix."""

from __future__ import annotations

import math
import re
from typing import get_args

import annotated_types
from pydantic.fields import FieldInfo

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.values import host, number

# Settings that name a file or directory (ENTRYPOINT_CONFIG may be a shipped name or a path).
_PATHS = ("config", "run_dir", "log_dir", "data_dir", "job_token_file")
_DECIMAL = re.compile(r"^(?:[0-9]{1,12}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})$")


def _range(name: str, field: FieldInfo) -> tuple[float, bool, float]:
    """(lowest, whether the lowest itself is allowed, highest) from the field's constraints;
    every numeric setting states both ends."""
    low: float | None = None
    high: float | None = None
    closed = True
    for rule in field.metadata:
        if isinstance(rule, annotated_types.Ge):
            low, closed = float(rule.ge), True  # type: ignore[arg-type]
        elif isinstance(rule, annotated_types.Gt):
            low, closed = float(rule.gt), False  # type: ignore[arg-type]
        elif isinstance(rule, annotated_types.Le):
            high = float(rule.le)  # type: ignore[arg-type]
    if low is None or high is None:
        raise AssertionError(f"setting {name}: a number needs a lowest and a highest value")
    return low, closed, high


def check_text(name: str, variable: str, raw: str, field: FieldInfo) -> None:
    """Numbers in ASCII digits within the field's range (no `inf`, `nan`, `1e3`, `1_000`, sign
    or `²`), and the master one host: each refusal one line naming the range or the fix."""
    if not raw.strip().isprintable():
        raise ConfigError(
            variable,
            "***" if name == "job_token" else raw[:300],
            "holds a control character (a newline, tab...)",
            f"Set {variable} to the value alone, on one line",
        )
    if name == "master_addr":
        host(variable, raw)
        return
    if name in _PATHS:
        parts = raw.strip().encode(errors="surrogateescape").split(b"/")
        if len(raw) > 4095 or max(len(part) for part in parts) > 255:
            raise ConfigError(
                variable,
                raw[:300],
                "not a usable path (Linux allows 255 bytes per name, 4095 in all)",
                f"Set {variable} to a shorter path",
            )
        return
    annotation = field.annotation
    kinds = {annotation, *get_args(annotation)}
    if not kinds & {int, float}:
        return
    low, closed, high = _range(name, field)
    if int in kinds:
        start = int(low) if closed else int(low) + 1
        number(variable, raw, low=start, high=int(high), example=max(start, 1))
    elif float in kinds:
        text = raw.strip()
        shown = f"{'from' if closed else 'above'} {low:g} to {high:g}"
        if not _DECIMAL.match(text):
            raise ConfigError(
                variable,
                raw,
                "not a number (ASCII digits and at most one '.', such as 30 or 0.5)",
                f"Set {variable} to a number {shown}",
            )
        value = float(text)
        if not math.isfinite(value) or value > high or value < low or (value == low and not closed):
            raise ConfigError(
                variable, raw, f"is outside {shown}", f"Set {variable} to a number {shown}"
            )
