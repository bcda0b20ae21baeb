"""Secrets never reach a log line, `plan`, `doctor` or a printed command."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping

_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "KEY")
_NAMED = ("HF_TOKEN", "WANDB_API_KEY")
MASK = "***"


def is_secret(name: str) -> bool:
    upper = name.upper()
    return upper in _NAMED or any(marker in upper for marker in _MARKERS)


def secret_values(env: Mapping[str, str]) -> tuple[str, ...]:
    # Longest first, so that a secret containing another is masked whole.
    values = {v for k, v in env.items() if is_secret(k) and len(v) >= 4}
    return tuple(sorted(values, key=len, reverse=True))


def _written(value: str) -> set[str]:
    """The forms a value takes in output: as is, JSON-escaped (`s\\u00ebcret`), repr-escaped,
    and as one shell word (a quote inside it splits the raw text)."""
    return {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
            repr(value)[1:-1], shlex.quote(value)}


def mask(text: str, values: tuple[str, ...]) -> str:
    # Longest first, so that a form containing another is masked whole.
    for form in sorted({form for value in values for form in _written(value)}, key=len,
                       reverse=True):
        text = text.replace(form, MASK)
    return text
