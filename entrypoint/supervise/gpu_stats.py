"""The heartbeat's resource figures: each GPU's utilization, memory, temperature, power, SM
clock, the reasons its clocks are held down, and its uncorrected ECC errors from NVML; else the
CPU load. A figure NVML cannot give for a GPU (no sensor, no ECC, an older driver) is left out."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from entrypoint.control.node_stats import GpuFigures, NodeStats


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

    def read(self) -> NodeStats:
        gpus = []
        for handle in self.handles:
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:
                continue
            extras = {}
            for key, read in self._extras.items():
                try:
                    extras[key] = int(read(self.nvml, handle))
                except Exception:  # this GPU or driver has no such figure
                    continue
            gpus.append(GpuFigures(util, memory.used >> 20, memory.total >> 20, **extras))
        return NodeStats(gpus=tuple(gpus)) if gpus else NodeStats(load=os.getloadavg()[0])

    # name: how NVML gives it (pynvml's constants: 0 is NVML_TEMPERATURE_GPU and
    # NVML_VOLATILE_ECC, the count since the driver loaded; 1 is NVML_CLOCK_SM and
    # NVML_MEMORY_ERROR_TYPE_UNCORRECTED). `throttle` is NVML's bit mask of clock event reasons
    # (entrypoint.coordinator.slow_nodes names them).
    _extras = {
        "temp_c": lambda nvml, h: nvml.nvmlDeviceGetTemperature(h, 0),
        "power_w": lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) // 1000,
        "sm_mhz": lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, 1),
        "sm_max_mhz": lambda nvml, h: nvml.nvmlDeviceGetMaxClockInfo(h, 1),
        "throttle": lambda nvml, h: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        "ecc_uncorrected": lambda nvml, h: nvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),
    }
