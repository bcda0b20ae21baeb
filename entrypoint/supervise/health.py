"""The node's health at its edge (what each finding means: entrypoint.supervise.health_rules).

- `HealthWatch`: a thread for the node's life that waits on NVML's critical events (XID errors,
  double bit ECC, a GPU gone or asking for a recovery action) and, every few seconds, reads each
  GPU's uncorrected ECC count, row remapping and NVLink states and the plan's NICs and InfiniBand
  ports; each finding goes to `report` the moment it is seen.
- `before_start`: the checks before every start (the first and each restart), each bounded in
  time: the plan's GPUs there and free, no row remapping failed or pending, the plan's links up,
  the data, run and checkpoint directories answering, and the site's own check
  (ENTRYPOINT_HEALTH_CHECK). A directory on a hung network mount is a failed check, not a hang:
  it is read by a child process that is given up on when its time runs out.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from entrypoint.control.messages import Health
from entrypoint.plan.node_plan import Plan
from entrypoint.plan.settings import Settings
from entrypoint.supervise import probe
from entrypoint.supervise.gpu_stats import nvml_handle
from entrypoint.supervise.health_rules import (
    Event,
    GpuReading,
    driver_misfit,
    gpu_changes,
    is_up,
    link_changes,
    xid_event,
)

if TYPE_CHECKING:
    from entrypoint.supervise.logs import Logger

POLL_EVERY = 5.0  # seconds between readings of the counters and links
DIR_TIMEOUT = 10.0  # seconds a directory gets to answer before its check fails
GPU_FREE_WAIT = 30.0  # seconds, after a restart, for the old workers' GPU memory to be freed
SYS_NET = "/sys/class/net"
SYS_IB = "/sys/class/infiniband"


def load_nvml(devices: Sequence[str], nvml: Any = None) -> Any:
    """pynvml, initialized, when the plan has GPUs; None without (a CPU node, no driver)."""
    if not devices:
        return None
    try:
        nvml = nvml or importlib.import_module("pynvml")
        nvml.nvmlInit()
        return nvml
    except Exception:
        return None


def nvlink_domain(devices: Sequence[str], nvml: Any = None) -> str:
    """The NVLink domain of the plan's first GPU, `<cluster UUID>/<clique id>` as NVML's fabric
    info gives it once the fabric manager has registered the GPU (GB200/GB300 NVL72); "" on
    GPUs without one (an 8-GPU HGX board), or without GPUs."""
    loaded = load_nvml(devices, nvml)
    if loaded is None:
        return ""
    try:
        import ctypes

        handle = nvml_handle(loaded, devices[0])
        info = loaded.c_nvmlGpuFabricInfo_t()
        loaded.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        if info.state != getattr(loaded, "NVML_GPU_FABRIC_STATE_COMPLETED", 3) or info.status:
            return ""
        cluster = bytes(info.clusterUuid).hex()
        return f"{cluster}/{info.cliqueId}" if cluster.strip("0") else ""
    except Exception:  # no fabric info on this GPU or driver
        return ""


# -- the plan's links ---------------------------------------------------------------------------


def _names(value: str | None) -> list[str]:
    """NCCL's interface or HCA list (`eth0,eth1`, `=mlx5_0:1`): the names it includes; an
    exclusion list (`^docker0,lo`) names none."""
    if not value or value.startswith("^"):
        return []
    return [n for n in value.lstrip("=").split(",") if n]


def plan_links(env: Mapping[str, str | None], net: str = SYS_NET, ib: str = SYS_IB) -> dict:
    """{name: the sysfs file of its state} for the NICs (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)
    and InfiniBand ports (NCCL_IB_HCA) the plan sends traffic through. A NIC name is a prefix
    for NCCL unless the list starts with `=`; each matching interface is watched."""
    links: dict[str, str] = {}
    for variable in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        value = env.get(variable)
        exact = bool(value) and str(value).startswith("=")
        present = sorted(os.listdir(net)) if os.path.isdir(net) else []
        for name in _names(value):
            for nic in [name] if exact else [n for n in present if n.startswith(name)] or [name]:
                links[nic] = f"{net}/{nic}/operstate"
    for name in _names(env.get("NCCL_IB_HCA")):
        hca, _, port = name.partition(":")
        listed = (
            sorted(os.listdir(f"{ib}/{hca}/ports")) if os.path.isdir(f"{ib}/{hca}/ports") else []
        )
        for p in [port] if port else listed or ["1"]:
            links[f"{hca}/{p}"] = f"{ib}/{hca}/ports/{p}/state"
    return links


def read_links(links: Mapping[str, str]) -> dict[str, str]:
    states = {}
    for name, path in links.items():
        try:
            states[name] = Path(path).read_text().strip()
        except OSError:
            states[name] = "gone"
    return states


# -- GPU readings ---------------------------------------------------------------------------


def _try(read: Callable[..., Any], *args: Any) -> Any:
    try:
        return read(*args)
    except Exception:  # this GPU or driver has no such figure
        return None


def gpu_reading(nvml: Any, handle: Any) -> GpuReading:
    remap = _try(nvml.nvmlDeviceGetRemappedRows, handle)
    links = None
    if _try(nvml.nvmlDeviceGetNvLinkState, handle, 0) is not None:
        links = frozenset(
            link
            for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
            if _try(nvml.nvmlDeviceGetNvLinkState, handle, link) == 1
        )
    return GpuReading(
        ecc_uncorrected=_try(nvml.nvmlDeviceGetTotalEccErrors, handle, 1, 0),
        remap_failed=bool(remap[3]) if remap else None,
        remap_pending=bool(remap[2]) if remap else None,
        nvlinks_up=links,
    )


# -- while the job runs ---------------------------------------------------------------------

# NVML event types (nvml.h): XID, double-bit ECC, row remapping failed, GPU unavailable,
# recovery action
_XID, _DBE, _REMAP_FAILED, _GONE, _RECOVERY = 0x8, 0x2, 0x800, 0x4000, 0x8000
_EVENTS = _XID | _DBE | _REMAP_FAILED | _GONE | _RECOVERY


def nvml_event(gpu: str, kind: int, data: int) -> Event | None:
    """One NVML event as this node's health event."""
    if kind & _XID:
        return xid_event(gpu, int(data))
    if kind & _DBE:
        return Event("ecc_double_bit", f"GPU {gpu}", f"GPU {gpu}: double-bit ECC error", True)
    if kind & _REMAP_FAILED:
        return Event("remap_failed", f"GPU {gpu}", f"GPU {gpu}: row remapping failed", True)
    if kind & _GONE:
        return Event("gpu_unavailable", f"GPU {gpu}", f"GPU {gpu} became unavailable", True)
    if kind & _RECOVERY and data:
        actions = {
            1: "a GPU reset",
            2: "a node reboot",
            3: "draining peer traffic",
            4: "draining and a GPU reset",
        }
        action = actions.get(int(data), f"recovery action {data}")
        return Event(
            "recovery_action", f"GPU {gpu}", f"GPU {gpu}: the driver asks for {action}", True
        )
    return None


class HealthWatch(threading.Thread):
    """This node's GPUs and links while it lives; `report(event)` for each finding."""

    def __init__(
        self,
        devices: Sequence[str],
        links: Mapping[str, str],
        report: Callable[[Event], None],
        nvml: Any = None,
        every: float = POLL_EVERY,
    ) -> None:
        super().__init__(name="health", daemon=True)
        self.devices, self.links, self.report, self.every = (
            tuple(devices),
            dict(links),
            report,
            every,
        )
        self.nvml = load_nvml(self.devices, nvml)
        self.halt = threading.Event()
        self.handles: dict[str, Any] = {}
        if self.nvml is not None:
            for device in self.devices:
                handle = _try(nvml_handle, self.nvml, device)
                if handle is not None:
                    self.handles[device] = handle
        self.events = self._event_set()
        self.baseline = self.readings()  # as the node starts: what changes from here is news
        self.start()

    def _event_set(self) -> Any:
        if not self.handles:
            return None
        nvml = self.nvml
        events = _try(nvml.nvmlEventSetCreate)
        if events is None:
            return None
        registered = 0
        for handle in self.handles.values():
            supported = _try(nvml.nvmlDeviceGetSupportedEventTypes, handle)
            wanted = _EVENTS & (supported if supported is not None else _EVENTS)
            if not wanted:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, wanted, events)
                registered += 1
            except Exception:  # this GPU gives no events: its counters are still read
                continue
        return events if registered else None

    def _which(self, device_handle: Any) -> str:
        for device, handle in self.handles.items():
            if handle == device_handle or _address(handle) == _address(device_handle):
                return device
        return "?"

    def readings(self) -> tuple[dict[str, GpuReading], dict[str, str]]:
        gpus = {d: gpu_reading(self.nvml, h) for d, h in self.handles.items()}
        return gpus, read_links(self.links)

    def run(self) -> None:
        gpus, links = self.baseline
        next_poll = time.monotonic() + self.every
        while not self.halt.is_set():
            left = next_poll - time.monotonic()
            if left > 0:
                self._wait(min(left, 1.0))
                continue
            next_poll = time.monotonic() + self.every
            now_gpus, now_links = self.readings()
            for device, reading in now_gpus.items():
                for event in gpu_changes(device, gpus.get(device, reading), reading):
                    self.report(event)
            for event in link_changes(links, now_links):
                self.report(event)
            gpus, links = now_gpus, now_links

    def _wait(self, seconds: float) -> None:
        if self.events is None:
            self.halt.wait(seconds)
            return
        try:
            data = self.nvml.nvmlEventSetWait_v2(self.events, int(seconds * 1000))
        except Exception:  # NVML's timeout, or an error: nothing happened that it can say
            return
        event = nvml_event(self._which(data.device), int(data.eventType), int(data.eventData))
        if event is not None:
            self.report(event)

    def stop(self) -> None:
        self.halt.set()


def _address(handle: Any) -> int | None:
    try:
        import ctypes

        return ctypes.cast(handle, ctypes.c_void_p).value
    except Exception:
        return None


def watch(plan: Plan, log: Logger, channel: Callable[[], Any]) -> HealthWatch:
    """The watch over the plan's GPUs and links for a node's life: each finding said in this
    node's log (once for one that is not fatal) and sent to node 0 (`channel()`: the channel to
    node 0 now), which takes the node out of the job for a fatal one."""
    said: set[tuple[str, str]] = set()

    def report(event: Event) -> None:
        if event.fatal:
            text = f"{event.text}: fatal; node 0 takes this node out of the job"
            log.error(text, health=event.kind)
        elif (event.kind, event.where) not in said:
            said.add((event.kind, event.where))
            log.warning(f"{event.text} (counted; the job goes on)", health=event.kind)
        to = channel()
        if to is not None:
            to.send(Health(event.kind, event.where, event.text, event.fatal))

    return HealthWatch(plan.devices, plan_links(plan.env), report)


# -- before every start -----------------------------------------------------------------------


@dataclass(frozen=True)
class Failed:
    """A check before the start that failed: what, and what to do."""

    check: str
    reason: str
    fix: str

    def line(self) -> str:
        return f"{self.check}: {self.reason}. {self.fix}"


# A child process reads or writes the directory: a hung mount holds the child, not the node.
_DIR_PROBE = """
import os, sys
path, write = sys.argv[1], sys.argv[2] == "1"
os.listdir(path)
if write:
    probe = os.path.join(path, f".entrypoint-health-{os.getpid()}")
    with open(probe, "wb") as f:
        f.write(b"ok")
        f.flush()
        os.fsync(f.fileno())
    with open(probe, "rb") as f:
        assert f.read() == b"ok"
    os.unlink(probe)
"""


def directory(
    variable: str, path: Path, write: bool, timeout: float = DIR_TIMEOUT
) -> Failed | None:
    """`path` lists (and takes a file, written, synced, read back and removed) within
    `timeout` seconds."""
    what = "readable and writable" if write else "readable"
    fix = f"mount it (or fix its storage) on this node, or point {variable} elsewhere"
    try:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-c", _DIR_PROBE, str(path), "1" if write else "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as problem:
        return Failed(f"{variable}={path}", f"cannot check it ({problem})", fix)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # a process in a hung mount's wait dies once the mount answers or aborts
        return Failed(
            f"{variable}={path}",
            f"not {what} within {timeout:g} s (a hung network or FUSE mount?)",
            fix,
        )
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["?"])[-1]
        return Failed(f"{variable}={path}", f"not {what}: {last[:300]}", fix)
    return None


def site_check(script: str, timeout: float) -> Failed | None:
    """ENTRYPOINT_HEALTH_CHECK: the site's own check; exit 0 is healthy, anything else fails
    with the last line it printed."""
    name = f"ENTRYPOINT_HEALTH_CHECK={script}"
    fix = "the site's health check failed on this node: see its line, or ask who wrote it"
    try:
        proc = subprocess.run(
            [script], capture_output=True, timeout=timeout, start_new_session=True, check=False
        )
    except subprocess.TimeoutExpired:
        return Failed(name, f"did not finish within {timeout:g} s", fix)
    except OSError as err:
        return Failed(name, f"cannot run it ({err.strerror})", "make it an executable file")
    if proc.returncode == 0:
        return None
    text = (proc.stdout + proc.stderr).decode(errors="replace").strip().splitlines()
    return Failed(name, f"exit {proc.returncode}: {(text or ['(no output)'])[-1][:300]}", fix)


def gpus_free(nvml: Any, handles: Mapping[str, Any], wait: float) -> list[Failed]:
    """Every planned GPU answers and no process holds it; `wait`: seconds for the processes
    there to go (the last start's workers, after a restart)."""
    out: list[Failed] = []
    end = time.monotonic() + wait
    while True:
        out = []
        for device, handle in handles.items():
            procs = _try(nvml.nvmlDeviceGetComputeRunningProcesses, handle)
            if procs:
                used = sum(int(getattr(p, "usedGpuMemory", 0) or 0) for p in procs) >> 20
                pids = ", ".join(str(getattr(p, "pid", "?")) for p in procs[:5])
                out.append(
                    Failed(
                        f"GPU {device}",
                        f"held by {len(procs)} other process(es) (pid {pids}; {used} MiB)",
                        "stop what runs on it, or give this job other GPUs",
                    )
                )
        if not out or time.monotonic() >= end:
            return out
        time.sleep(1.0)


def driver_check(nvml: Any, runtime: str | None = None) -> Failed | None:
    """The node's driver against the image's CUDA (the CUDA 13 image on a driver older than
    580, say): one line with the fix before any trainer starts."""
    runtime = runtime or probe.image_cuda()
    cuda = _try(nvml.nvmlSystemGetCudaDriverVersion)
    driver = _try(nvml.nvmlSystemGetDriverVersion)
    if not runtime or not isinstance(cuda, int):
        return None
    driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    misfit = driver_misfit(cuda, runtime)
    return Failed(f"NVIDIA driver {driver}", *misfit) if misfit else None


def before_start(
    devices: Sequence[str],
    links: Mapping[str, str],
    dirs: Sequence[tuple[str, Path, bool]],
    hook: str | None,
    hook_timeout: float,
    restart: bool = False,
    nvml: Any = None,
    alone: bool = True,
) -> list[Failed]:
    """Every check before a start, each bounded; what failed. `alone`: this entrypoint is the
    node's only one, so any process on its GPUs is another job's (with one entrypoint per GPU,
    a sibling's trainer may already run there: not checked)."""
    failed: list[Failed] = []
    loaded = load_nvml(devices, nvml)
    if devices and loaded is not None:
        misfit = driver_check(loaded)
        if misfit is not None:
            return [misfit]  # every other GPU check would only say the same again
        handles = {}
        for device in devices:
            handle = _try(nvml_handle, loaded, device)
            if handle is None:
                failed.append(
                    Failed(
                        f"GPU {device}",
                        "NVML does not find it",
                        "check the node (nvidia-smi); the GPU may have fallen off the bus",
                    )
                )
                continue
            handles[device] = handle
            reading = gpu_reading(loaded, handle)
            if reading.remap_failed:
                failed.append(
                    Failed(
                        f"GPU {device}",
                        "row remapping failed",
                        "the GPU needs service: drain this node",
                    )
                )
            elif reading.remap_pending:
                reset = "reset the GPU (nvidia-smi -r) or reboot the node"
                failed.append(Failed(f"GPU {device}", "a row remapping waits for a reset", reset))
        if alone:
            failed += gpus_free(loaded, handles, GPU_FREE_WAIT if restart else 0.0)
    for name, state in read_links(links).items():
        if not is_up(state):
            what = "InfiniBand port" if "/" in name else "network interface"
            failed.append(
                Failed(
                    f"{what} {name}",
                    f"is {state.lower()}",
                    "bring the link up, or leave it out of the plan's "
                    "NCCL_SOCKET_IFNAME / NCCL_IB_HCA",
                )
            )
    for variable, path, write in dirs:
        problem = directory(variable, path, write)
        if problem is not None:
            failed.append(problem)
    if hook:
        problem = site_check(hook, hook_timeout)
        if problem is not None:
            failed.append(problem)
    return failed


def checks(plan: Plan, settings: Settings, restart: bool) -> list[Failed]:
    """The checks before a start of this node's plan; ENTRYPOINT_HEALTH_CHECKS=0: none."""
    if not settings.health_checks:
        return []
    dirs = [
        (f"ENTRYPOINT_{name.upper()}", path, write)
        for name, path, write in (
            ("data_dir", settings.data_dir, False),
            ("checkpoint_dir", settings.checkpoint_dir, True),
        )
        if path is not None
    ]
    return before_start(
        plan.devices,
        plan_links(plan.env),
        dirs,
        settings.health_check,
        settings.health_check_timeout,
        restart=restart,
        alone=plan.spawn,  # one entrypoint for the node (not one per GPU, as SLURM tasks may be)
    )
