"""Secrets never reach a log line, `plan`, `doctor` or a printed command."""

from __future__ import annotations

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


def mask(text: str, values: tuple[str, ...]) -> str:
    for value in values:
        text = text.replace(value, MASK)
    return text
