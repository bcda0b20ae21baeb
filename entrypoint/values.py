"""Values that remember where they came from, and strict parsers for environment strings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from entrypoint.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Sourced(Generic[T]):
    """A decided value and where it came from: `env SLURM_NNODES`, `probe nvml`, `default`..."""

    value: T
    source: str


def env_source(*names: str) -> str:
    return "env " + "+".join(names)


def positive_int(name: str, raw: str | None, *, allow_zero: bool = False) -> int:
    """Parse a count such as `2`; refuse anything else with a one-line error."""
    what = "a whole number of 0 or more" if allow_zero else "a positive whole number"
    if raw is None or not raw.strip().lstrip("+").isdigit():
        raise ConfigError(name, raw, f"not {what}", f"Set {name} to {what}, for example 2")
    value = int(raw.strip())
    if value == 0 and not allow_zero:
        raise ConfigError(name, raw, f"not {what}", f"Set {name} to {what}, for example 2")
    return value


def index(name: str, raw: str | None) -> int:
    """Parse a 0-based index (rank, node rank)."""
    return positive_int(name, raw, allow_zero=True)


def port(name: str, raw: str | None) -> int:
    if raw is None or not raw.strip().isdigit() or not 1 <= int(raw) <= 65535:
        raise ConfigError(
            name, raw, "not a TCP port", f"Set {name} to a port between 1 and 65535, such as 29500"
        )
    return int(raw)


def first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of `names` that is set to a non-empty value, as (name, value)."""
    for name in names:
        raw = env.get(name)
        if raw is not None and raw.strip() != "":
            return name, raw.strip()
    return None


def below(rank_name: str, rank: int, size_name: str, size: int) -> None:
    if rank >= size:
        raise ConfigError(
            rank_name,
            rank,
            f"must be below {size_name}={size} (ranks count from 0)",
            f"Give each node a {rank_name} from 0 to {size - 1}, or fix {size_name}",
        )


def variable_of(source: str) -> str:
    """`env RANK (as node index)` -> `RANK`: the variable a source names, for error lines."""
    return source.removeprefix("env ").split(" ")[0]
