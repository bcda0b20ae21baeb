"""The heartbeat's resource figures: GPU utilization and memory from NVML, else the CPU load."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any


def nvml_handle(nvml: Any, device: str) -> Any:
    """The NVML handle of one of the plan's devices: an index (NVML counts every GPU of the
    machine, whatever CUDA_VISIBLE_DEVICES says, as the plan's ids do), or a GPU-/MIG- UUID."""
    if device.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(device))
    return nvml.nvmlDeviceGetHandleByUUID(device)


class Stats:
    """GPU utilization and memory (NVML) of this node's GPUs, or the CPU load."""

    def __init__(self, devices: Sequence[str], nvml: Any = None) -> None:
        """`devices`: the plan's (Plan.devices); `nvml`: the module, pynvml unless given."""
        self.handles: list[Any] = []
        self.nvml: Any = None
        if devices:
            try:
                if nvml is None:
                    nvml = importlib.import_module("pynvml")  # at the edge, with GPUs only
                nvml.nvmlInit()
                self.nvml = nvml
                self.handles = [nvml_handle(nvml, device) for device in devices]
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
