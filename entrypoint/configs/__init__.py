"""Shipped training configs, named by total GPU count (`8gpu`, `16gpu`), plus `cpu` and `1gpu`.

Each directory holds `config.json` (what it is for, and accelerate's settings that do not
depend on the cluster) and `deepspeed.json` (with gradient_accumulation_steps "auto").
The entrypoint derives the accumulation so that train_batch_size = micro batch x accumulation
x world size holds: the global batch is the same on 8 and 16 GPUs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from entrypoint.errors import ConfigError

SHIPPED = Path(__file__).parent
VARIABLE = "ENTRYPOINT_CONFIG"


@dataclass(frozen=True)
class Config:
    name: str
    path: Path
    description: str
    device: str  # "cuda" | "cpu"
    world_size: int | None  # the total GPU count it is made for; None: any
    deepspeed: dict
    accelerate: dict


def load(path: Path) -> Config:
    meta = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
    try:
        deepspeed = json.loads((path / "deepspeed.json").read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(VARIABLE, str(path), f"has no readable deepspeed.json ({err})",
                          "Point it at a directory with deepspeed.json (and optional config.json)") from None
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


def select(named: str | None, *, device: str, world_size: int) -> tuple[Config | None, str]:
    """(config, why). None when no shipped config fits and none was named."""
    catalog = shipped()
    if named:
        if named in catalog:
            return catalog[named], f"env {VARIABLE}={named}"
        path = Path(named)
        if path.is_dir():
            return load(path), f"env {VARIABLE} (directory)"
        raise ConfigError(VARIABLE, named, "is neither a shipped config nor a directory",
                          f"Use one of {', '.join(catalog)} or a directory holding deepspeed.json")
    if device == "cpu":
        return catalog["cpu"], "device is cpu"
    for config in catalog.values():
        if config.device == "cuda" and config.world_size == world_size:
            return config, f"world size {world_size} matches {config.name}"
    return None, (f"no shipped config for {world_size} GPUs in total (have: "
                  f"{', '.join(catalog)}); set {VARIABLE} to one of them or to your own directory")


def derive_deepspeed(config: Config, world_size: int) -> dict:
    """deepspeed.json with gradient_accumulation_steps derived from the world size."""
    ds = dict(config.deepspeed)
    total = ds.get("train_batch_size")
    micro = ds.get("train_micro_batch_size_per_gpu")
    if not isinstance(total, int) or not isinstance(micro, int):
        return ds  # nothing to derive: DeepSpeed checks the rest itself
    if total % (micro * world_size):
        fits = [n for n in range(1, total // micro + 1) if total % (micro * n) == 0]
        raise ConfigError(
            VARIABLE, config.name,
            f"global batch {total} is not micro batch {micro} x a whole accumulation x world size {world_size}",
            f"Run with a world size in {fits}, or use a config made for {world_size} workers")
    ds["gradient_accumulation_steps"] = total // (micro * world_size)
    return ds
