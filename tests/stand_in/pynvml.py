"""A stand-in for pynvml (nvidia-ml-py) on a machine without a GPU: the one part of a node that
cannot exist here. Put this directory first on PYTHONPATH of an `entrypoint run` and it sees
STAND_IN_NVML_GPUS GPUs (default 2) on driver STAND_IN_NVML_DRIVER (`<version>,<newest CUDA
as NVML gives it>`, default `580.95.05,13000`); the test drives them through files in
STAND_IN_NVML_DIR:

- `events`: one line per NVML event, `<gpu index> xid <code>` (an XID critical error) or
  `<gpu index> <event type number> <data>`; each is returned once by nvmlEventSetWait_v2, in order.
- `gpu<i>.json`: that GPU's counters, read at every call: {"ecc_uncorrected": n,
  "remap": [corrected, uncorrected, pending, failed], "nvlinks": [0, 1, ...] (the links up),
  "procs": [[pid, bytes], ...] (processes holding it), "missing": true (NVML cannot find it),
  "fabric": [cluster UUID as 32 hex digits, clique id] (its NVLink domain)}.

Nothing of the entrypoint is changed for a test: it imports this module as it imports pynvml.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_NO_PERMISSION = 4
NVML_NVLINK_MAX_LINKS = 18
NVML_GPU_FABRIC_STATE_COMPLETED = 3


class c_nvmlGpuFabricInfo_t(ctypes.Structure):  # noqa: N801 - pynvml's name
    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint8),
    ]


nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeDramRetirementFailure = 0x800
nvmlEventTypeGpuUnavailableError = 0x4000
nvmlEventTypeGpuRecoveryAction = 0x8000


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(f"stand-in NVML error {value}")


def _dir() -> Path:
    return Path(os.environ.get("STAND_IN_NVML_DIR", "/nonexistent"))


def _count() -> int:
    return int(os.environ.get("STAND_IN_NVML_GPUS", "2"))


def _gpu(index: int) -> dict:
    try:
        return json.loads((_dir() / f"gpu{index}.json").read_text())
    except (OSError, ValueError):
        return {}


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def _driver() -> tuple[str, int]:
    version, _, cuda = os.environ.get("STAND_IN_NVML_DRIVER", "580.95.05,13000").partition(",")
    return version, int(cuda)


def nvmlSystemGetDriverVersion() -> str:
    return _driver()[0]


def nvmlSystemGetCudaDriverVersion() -> int:
    return _driver()[1]


def nvmlDeviceGetCount() -> int:
    return _count()


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < _count() or _gpu(index).get("missing"):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return index


def nvmlDeviceGetHandleByUUID(uuid) -> int:
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    return nvmlDeviceGetHandleByIndex(int(text.rsplit("-", 1)[-1]))


def nvmlDeviceGetName(handle: int) -> str:
    return "NVIDIA H100 80GB HBM3 (stand-in)"


def nvmlDeviceGetUUID(handle: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{handle:012d}"


def nvmlDeviceGetMemoryInfo(handle: int):
    used = sum(b for _, b in _gpu(handle).get("procs", []))
    return SimpleNamespace(total=80 << 30, used=used, free=(80 << 30) - used)


def nvmlDeviceGetUtilizationRates(handle: int):
    return SimpleNamespace(gpu=50, memory=20)


def nvmlDeviceGetTotalEccErrors(handle: int, error_type: int, counter_type: int) -> int:
    return int(_gpu(handle).get("ecc_uncorrected", 0))


def nvmlDeviceGetRemappedRows(handle: int) -> tuple[int, int, int, int]:
    return tuple(_gpu(handle).get("remap", [0, 0, 0, 0]))  # type: ignore[return-value]


def nvmlDeviceGetNvLinkState(handle: int, link: int) -> int:
    up = _gpu(handle).get("nvlinks")
    if up is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 1 if link in up else 0


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list:
    return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in _gpu(handle).get("procs", [])]


def nvmlDeviceGetGpuFabricInfo(handle: int, info) -> int:
    fabric = _gpu(handle).get("fabric")
    if fabric is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    target = ctypes.cast(info, ctypes.POINTER(c_nvmlGpuFabricInfo_t)).contents
    target.clusterUuid[:] = list(bytes.fromhex(fabric[0]))
    target.cliqueId, target.state, target.status = fabric[1], NVML_GPU_FABRIC_STATE_COMPLETED, 0
    return NVML_SUCCESS


def nvmlDeviceGetSupportedEventTypes(handle: int) -> int:
    return 0xFFFF


class _EventSet:
    def __init__(self) -> None:
        self.read = 0  # lines of `events` returned so far
        self.devices: set[int] = set()


def nvmlEventSetCreate() -> _EventSet:
    return _EventSet()


def nvmlDeviceRegisterEvents(handle: int, types: int, events: _EventSet) -> None:
    events.devices.add(handle)


def nvmlEventSetFree(events: _EventSet) -> None:
    pass


def nvmlEventSetWait_v2(events: _EventSet, timeout_ms: int):
    end = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            lines = (_dir() / "events").read_text().splitlines()
        except OSError:
            lines = []
        if len(lines) > events.read:
            line = lines[events.read].split()
            events.read += 1
            gpu = int(line[0])
            kind = nvmlEventTypeXidCriticalError if line[1] == "xid" else int(line[1], 0)
            return SimpleNamespace(device=gpu, eventType=kind, eventData=int(line[2]))
        if time.monotonic() >= end:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(0.05)
