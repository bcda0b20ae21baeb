"""Secrets never reach a log line, `plan`, `doctor` or a printed command.

A variable is a secret by its name: one of the well-known names below, or a name that ends in
_TOKEN, _KEY, _SECRET, _PASSWORD (and a few spellings of them). A marker anywhere in the name
is not enough: TOKENIZERS_PARALLELISM=false would mask every "false" in every log line, and
NCCL_IB_PKEY or KEYRING_BACKEND are settings, not credentials.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from entrypoint.plan import files
from entrypoint.plan.errors import ConfigError

# The job's token (entrypoint.control.identity reads it for the handshake); masked like a secret.
TOKEN_VARIABLE = "ENTRYPOINT_JOB_TOKEN"
TOKEN_FILE_VARIABLE = "ENTRYPOINT_JOB_TOKEN_FILE"

_SUFFIXES = ("_TOKEN", "_KEY", "_SECRET", "_PASSWORD", "_PASSWD", "_APIKEY", "_ACCESS_KEY")
# Credentials whose names do not end in a marker, and bare markers used as names.
_NAMED = frozenset(
    {
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "NGC_API_KEY",
        "OPENAI_API_KEY",
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_SAS_TOKEN",
        "NEPTUNE_API_TOKEN",
        "COMET_API_KEY",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_TRACKING_TOKEN",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "API_KEY",
        "APIKEY",
    }
)
MASK = "***"


def is_secret(name: str) -> bool:
    upper = name.upper()
    return upper in _NAMED or upper.endswith(_SUFFIXES)


def secret_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """The secrets' values to mask: those of secret variables, and the job token read from
    ENTRYPOINT_JOB_TOKEN_FILE (masked like ENTRYPOINT_JOB_TOKEN)."""
    values = {v for k, v in env.items() if is_secret(k) and len(v) >= 4}
    token = file_token(env)
    if token and len(token) >= 4:
        values.add(token)
    # Longest first, so that a secret containing another is masked whole.
    return tuple(sorted(values, key=len, reverse=True))


def _written(value: str) -> set[str]:
    """The forms a value takes in output: as is, JSON-escaped (`s\\u00ebcret`), repr-escaped,
    and as one shell word (a quote inside it splits the raw text)."""
    return {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
        shlex.quote(value),
    }


def mask(text: str, values: tuple[str, ...]) -> str:
    # Longest first, so that a form containing another is masked whole.
    for form in sorted(
        {form for value in values for form in _written(value)}, key=len, reverse=True
    ):
        text = text.replace(form, MASK)
    return text


def mask_data(data: Any, values: tuple[str, ...]) -> Any:
    """`mask` over the strings inside JSON-shaped data (keys too), other values kept as they
    are: what is dumped afterwards stays valid JSON whatever the secret is (masking the dumped
    text would turn a secret `true` into `***` where a JSON true stood)."""
    if not values:
        return data
    if isinstance(data, str):
        return mask(data, values)
    if isinstance(data, Mapping):
        return {mask_data(k, values): mask_data(v, values) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [mask_data(v, values) for v in data]
    return data


def file_token(env: Mapping[str, str]) -> str | None:
    """The token in the file ENTRYPOINT_JOB_TOKEN_FILE names, for masking (None when it cannot
    be read: read_token says why when the node starts)."""
    path = env.get(TOKEN_FILE_VARIABLE)
    if not path:
        return None
    try:
        return (
            files.read_bounded(Path(path), files.MAX_TOKEN, TOKEN_FILE_VARIABLE, "")
            .decode("utf-8")
            .strip()
            or None
        )
    except (ConfigError, UnicodeDecodeError):
        return None
