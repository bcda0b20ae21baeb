"""A node's resource figures, as a beat carries them to node 0 (entrypoint.supervise.gpu_stats reads
them): each GPU's utilization, memory and, where NVML gives them, temperature, power, SM clocks, the
reasons its clocks are held down and its uncorrected ECC errors; else the CPU load. Node 0 reads
them in its monitor table, its slow-node rule (entrypoint.coordinator.slow_nodes) and /metrics."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from entrypoint.control.message_fields import BadMessage, float_field, int_field

# The figures a GPU may lack (no sensor, no ECC, an older driver): name and bounds.
GPU_EXTRAS = {
    "temp_c": (0, 1000),
    "power_w": (0, 100_000),
    "sm_mhz": (0, 100_000),
    "sm_max_mhz": (0, 100_000),
    "throttle": (0, (1 << 64) - 1),
    "ecc_uncorrected": (0, 1 << 62),
}
MAX_GPUS = 1024  # GPUs one beat reports


@dataclass(frozen=True)
class GpuFigures:
    """One GPU's figures; None: the GPU or its driver gives no such figure."""

    util: float  # percent
    mem_used_mib: int
    mem_total_mib: int
    temp_c: int | None = None
    power_w: int | None = None
    sm_mhz: int | None = None
    sm_max_mhz: int | None = None
    throttle: int | None = None  # NVML's clock event reasons, a bit mask
    ecc_uncorrected: int | None = None  # since the driver loaded

    @classmethod
    def from_wire(cls, g: dict) -> GpuFigures:
        extras = {
            key: int_field(g, key, lo, hi)
            for key, (lo, hi) in GPU_EXTRAS.items()
            if g.get(key) is not None
        }
        return cls(
            util=float_field(g, "util"),
            mem_used_mib=int_field(g, "mem_used_mib", 0, 1 << 40),
            mem_total_mib=int_field(g, "mem_total_mib", 0, 1 << 40),
            **extras,
        )

    def to_wire(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class NodeStats:
    """A node's figures: its GPUs', or the CPU load of a node without any; empty (false) when a
    beat carries none."""

    gpus: tuple[GpuFigures, ...] = ()
    load: float | None = None

    def __bool__(self) -> bool:
        return bool(self.gpus) or self.load is not None

    @classmethod
    def from_wire(cls, raw: Any) -> NodeStats:
        if raw is None:
            return cls()
        if type(raw) is not dict:
            raise BadMessage("stats must be an object")
        if "gpus" in raw:
            gpus = raw["gpus"]
            if (
                type(gpus) is not list
                or len(gpus) > MAX_GPUS
                or any(type(g) is not dict for g in gpus)
            ):
                raise BadMessage(f"stats.gpus must be a list of at most {MAX_GPUS} objects")
            return cls(gpus=tuple(GpuFigures.from_wire(g) for g in gpus))
        if "load" in raw:
            return cls(load=float_field(raw, "load"))
        return cls()

    def to_wire(self) -> dict:
        if self.gpus:
            return {"gpus": [g.to_wire() for g in self.gpus]}
        return {} if self.load is None else {"load": self.load}
