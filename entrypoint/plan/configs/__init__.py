"""Shipped training configs, named by total GPU count (`8gpu`, `16gpu`), plus `cpu` and `1gpu`.

Each directory holds `config.json` (what it is for, and accelerate's settings that do not
depend on the cluster) and `deepspeed.json` (with gradient_accumulation_steps "auto").
Any world size runs: the config made for the nearest size is chosen, and the split of its
global batch (micro batch x accumulation x world size) is derived for the world size at hand:
kept exactly where the world size divides it (the micro batch lowered if needed, never raised),
otherwise the nearest one with the config's micro batch, stated in the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from entrypoint.plan import files
from entrypoint.plan.errors import ConfigError, clip
from entrypoint.plan.values import Source, derived, env_var

SHIPPED = Path(__file__).parent
VARIABLE = "ENTRYPOINT_CONFIG"
DEVICES = ("cuda", "cpu")
MAX_BATCH = 10**9  # samples in a batch field: far above any real batch, and it keeps the split fast


@dataclass(frozen=True)
class Config:
    name: str
    path: Path
    description: str
    device: str  # "cuda" | "cpu"
    world_size: int | None  # the total GPU count it is made for; None: any
    deepspeed: dict
    accelerate: dict


@dataclass(frozen=True)
class Split:
    """How a global batch is shared: train_batch_size = micro x accumulation x world size."""

    global_batch: int
    micro: int
    accumulation: int
    asked: int  # the global batch the config asks for
    why: str


def _invalid(path: Path, field: str, value: object, problem: str, fix: str) -> ConfigError:
    return ConfigError(
        VARIABLE, str(path.parent), f"{path.name}: {field}={clip(repr(value))} {problem}", fix
    )


def _read_json(path: Path, *, required: bool) -> dict:
    if not path.exists() and not path.is_symlink() and not required:
        return {}
    data = files.load_json(
        path,
        VARIABLE,
        f"Make {path} a readable regular file holding one JSON object, at most 1 MiB",
        value=str(path.parent),
    )
    if not isinstance(data, dict):
        raise ConfigError(
            VARIABLE,
            str(path.parent),
            f"{path.name} holds a JSON {type(data).__name__}, not an object",
            f"Fix {path}: it must hold one JSON object ({{...}})",
        )
    return data


def _check_batch_fields(path: Path, ds: dict) -> None:
    for field in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    ):
        value = ds.get(field, "auto")
        ok = value == "auto" or (
            isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_BATCH
        )
        if not ok:
            raise _invalid(
                path,
                field,
                value,
                f'is not a positive whole number up to {MAX_BATCH:,} or "auto"',
                f'Set {field} in {path} to a positive integer or "auto"',
            )


def _check_meta(path: Path, meta: dict) -> None:
    checks = (
        ("description", lambda v: isinstance(v, str), "is not a string", '"..."'),
        ("device", lambda v: v in DEVICES, "is not cuda or cpu", '"cuda" or "cpu"'),
        (
            "world_size",
            lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
            "is not a positive whole number or null",
            "a GPU count such as 8, or null",
        ),
        ("accelerate", lambda v: isinstance(v, dict), "is not an object", "{...}"),
    )
    for field, ok, problem, example in checks:
        if field in meta and not ok(meta[field]):
            raise _invalid(path, field, meta[field], problem, f"Set {field} in {path} to {example}")


def load(path: Path) -> Config:
    """Read and validate a config directory as a whole; one line naming the file and field."""
    if not path.is_dir():
        raise ConfigError(
            VARIABLE,
            str(path),
            "is not a directory",
            "Point it at a directory holding deepspeed.json",
        )
    meta = _read_json(path / "config.json", required=False)
    deepspeed = _read_json(path / "deepspeed.json", required=True)
    _check_meta(path / "config.json", meta)
    _check_batch_fields(path / "deepspeed.json", deepspeed)
    return Config(
        name=path.name,
        path=path,
        description=meta.get("description", ""),
        device=meta.get("device", "cuda"),
        world_size=meta.get("world_size"),
        deepspeed=deepspeed,
        accelerate=meta.get("accelerate", {}),
    )


def shipped() -> dict[str, Config]:
    return {p.name: load(p) for p in sorted(SHIPPED.iterdir()) if (p / "deepspeed.json").exists()}


def _nearest(catalog: dict[str, Config], world_size: int) -> Config:
    """The cuda config made for the size nearest to world_size, on a log scale (4 -> 8gpu,
    12 -> 16gpu, 2 -> 1gpu); a tie goes to the larger."""
    sized = {c.world_size: c for c in catalog.values() if c.device == "cuda" and c.world_size}
    best = min(sized, key=lambda n: (abs(math.log2(n) - math.log2(world_size)), -n))
    return sized[best]


def select(named: str | None, *, device: str, world_size: int) -> tuple[Config, Source]:
    """(config, why): the named one, else the one for this device and world size."""
    catalog = shipped()
    if named:
        if named in catalog:
            return catalog[named], env_var(VARIABLE, f"={named}")
        if Path(named).exists():
            return load(Path(named)), env_var(VARIABLE, "(directory)")
        raise ConfigError(
            VARIABLE,
            named,
            "is neither a shipped config nor a directory",
            f"Use one of {', '.join(catalog)} or a directory holding deepspeed.json",
        )
    if device == "cpu":
        return catalog["cpu"], derived("device is cpu")
    config = _nearest(catalog, world_size)
    if config.world_size == world_size:
        return config, derived(f"world size {world_size} matches {config.name}")
    return config, derived(
        f"nearest shipped config to {world_size} GPUs in total: {config.name} "
        f"(made for {config.world_size}; have {', '.join(catalog)})"
    )


def split(config: Config, world_size: int) -> Split | None:
    """The batch split for world_size, or None when the config states no global batch.

    With accumulation "auto": the config's global batch exactly when world_size divides it
    (the largest micro batch not above the config's), else the config's micro batch with the
    accumulation rounded to the nearest global batch. With a fixed accumulation the three numbers
    must already agree, and a mismatch is refused naming the world sizes that work."""
    ds = config.deepspeed
    total, micro = ds.get("train_batch_size"), ds.get("train_micro_batch_size_per_gpu")
    if not isinstance(total, int) or not isinstance(micro, int):
        return None  # nothing to derive: DeepSpeed checks the rest itself
    fixed = ds.get("gradient_accumulation_steps")
    if isinstance(fixed, int):
        if micro * fixed * world_size != total:
            fits = str(total // (micro * fixed)) if total % (micro * fixed) == 0 else "none"
            raise ConfigError(
                VARIABLE,
                str(config.path),
                f"deepspeed.json fixes train_batch_size {total} = micro batch {micro} x "
                f"accumulation {fixed} x world size, which holds only for world size "
                f"{fits}, not {world_size}",
                'Set gradient_accumulation_steps to "auto" there, or run on that many workers',
            )
        return Split(total, micro, fixed, total, f"{config.name}: fixed in deepspeed.json")
    if total % world_size == 0:
        per_rank = total // world_size
        m = _largest_divisor(per_rank, micro)
        lowered = "" if m == micro else f", micro batch lowered from {micro}"
        return Split(
            total,
            m,
            per_rank // m,
            total,
            f"{config.name}: global batch {total} kept = micro {m} x accumulation "
            f"{per_rank // m} x {world_size} workers{lowered}",
        )
    # Not divisible: keep the micro batch (tuned for memory), round the accumulation; lower
    # the micro batch only where one micro step of every worker already exceeds the batch.
    m = micro if micro * world_size <= total else max(1, round(total / world_size))
    a = max(1, round(total / (m * world_size)))
    made = m * a * world_size
    return Split(
        made,
        m,
        a,
        total,
        f"{config.name}: global batch {total} cannot be split over {world_size} "
        f"workers; nearest is {made} = micro {m} x accumulation {a} x {world_size}",
    )


def _largest_divisor(n: int, most: int) -> int:
    """The largest divisor of n not above most, trying at most min(most, sqrt(n)) numbers."""
    best = 1
    for d in range(1, min(most, math.isqrt(n)) + 1):
        if n % d == 0:
            best = max(best, d, n // d if n // d <= most else 1)
    return best


def derive_deepspeed(config: Config, world_size: int) -> dict:
    """deepspeed.json with the batch split derived for the world size."""
    ds = dict(config.deepspeed)
    found = split(config, world_size)
    if found is not None:
        ds |= {
            "train_batch_size": found.global_batch,
            "train_micro_batch_size_per_gpu": found.micro,
            "gradient_accumulation_steps": found.accumulation,
        }
    return ds
