"""The heartbeat's resource figures: GPU utilization and memory from NVML, else the CPU load."""

from __future__ import annotations

import os
from typing import Any


class Stats:
    """GPU utilization and memory (NVML) of this node's GPUs, or the CPU load."""

    def __init__(self, gpu_indices: list[int]) -> None:
        self.handles: list[Any] = []
        self.nvml: Any = None
        if gpu_indices:
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = pynvml
                self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in gpu_indices]
            except Exception:  # stats are nice to have; never a reason to stop
                self.handles = []

    def read(self) -> dict:
        gpus = []
        for handle in self.handles:
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                gpus.append(
                    {
                        "util": util,
                        "mem_used_mib": memory.used >> 20,
                        "mem_total_mib": memory.total >> 20,
                    }
                )
            except Exception:
                continue
        return {"gpus": gpus} if gpus else {"load": os.getloadavg()[0]}


def gpu_indices(cuda_visible_devices: str | None) -> list[int]:
    """The plan's CUDA_VISIBLE_DEVICES as NVML indices (UUIDs are passed over)."""
    if not cuda_visible_devices:
        return []
    return [int(x) for x in cuda_visible_devices.split(",") if x.isdigit()]
