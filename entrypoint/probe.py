"""The edge that looks at the machine: GPUs (NVML, /proc/driver/nvidia, nvidia-smi), network
interfaces, routes, DNS, InfiniBand. Each probe is small and returns plain values (facts.py)."""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

from entrypoint.facts import Facts, Gpu, Interface

_SIOCGIFADDR = 0x8915


def gpus() -> tuple[tuple[Gpu, ...], str]:
    """Every GPU this container sees, and how we know. NVML's own error is kept in the probe's
    words: a driver/library mismatch is not the same problem as no driver at all."""
    nvml_error = ""
    try:
        import pynvml  # nvidia-ml-py: a thin ctypes binding, cheap to import

        pynvml.nvmlInit()
        try:
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(handle)
                found.append(
                    Gpu(
                        index=i,
                        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                        name=_text(name),
                        memory_mib=pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1 << 20),
                    )
                )
            return tuple(found), "probe nvml"
        finally:
            pynvml.nvmlShutdown()
    except Exception as err:  # no driver library, no device: fall through to the next probe
        nvml_error = _nvml_reason(err)
    proc = sorted(glob.glob("/proc/driver/nvidia/gpus/*/information"))
    if proc:
        return tuple(
            Gpu(index=i, name=_proc_model(p)) for i, p in enumerate(proc)
        ), "probe /proc/driver/nvidia/gpus"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("GPU ")]
            return tuple(
                Gpu(
                    index=i,
                    name=ln.split(":", 1)[1].split("(")[0].strip(),
                    uuid=ln.rsplit("UUID: ", 1)[-1].rstrip(")") if "UUID" in ln else "",
                )
                for i, ln in enumerate(lines)
            ), "probe nvidia-smi -L"
        except (OSError, subprocess.SubprocessError):
            pass
    if nvml_error and "not found" not in nvml_error.lower():
        return (), f"probe: NVML failed ({nvml_error}); no GPU found by /proc or nvidia-smi"
    return (), "probe: no NVIDIA driver found (NVML, /proc/driver/nvidia, nvidia-smi)"


def _nvml_reason(err: Exception) -> str:
    """NVML's error in one line: `Driver/library version mismatch`, `Library Not Found`..."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (
        text
        if "library" in text.lower() or "driver" in text.lower() or "nvml" in text.lower()
        else f"{type(err).__name__}: {text}"
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _proc_model(path: str) -> str:
    for line in Path(path).read_text().splitlines():
        if line.startswith("Model:"):
            return line.split(":", 1)[1].strip()
    return ""


def interfaces() -> tuple[Interface, ...]:
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
                address = socket.inet_ntoa(packed[20:24])
            except OSError:
                address = ""
            found.append(Interface(name, address))
    return tuple(found)


def default_route() -> str | None:
    """The interface of the IPv4 default route (/proc/net/route)."""
    try:
        for line in Path("/proc/net/route").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 2 and fields[1] == "00000000":
                return fields[0]
    except OSError:
        pass
    return None


def resolve(name: str) -> str | None:
    try:
        return str(socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, UnicodeError):
        return None


def tcp_connect(ip: str, port: int, timeout: float = 2.0) -> str:
    """`open`, `refused`, `timeout` or `unreachable (why)`: a plain TCP connect, nothing sent."""
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as err:
        return f"unreachable ({err.strerror or err})"


def nvidia_driver() -> tuple[str | None, str | None]:
    """(driver version, the newest CUDA version it supports, e.g. "12.4") from NVML."""
    try:
        import pynvml  # as in gpus(): thin, and its absence is an answer

        pynvml.nvmlInit()
        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            return _text(pynvml.nvmlSystemGetDriverVersion()), f"{cuda // 1000}.{cuda % 1000 // 10}"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver library or no device
        return None, None


def source_address(ip: str) -> str | None:
    """The local address the kernel would use to reach ip (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((ip, 9))
            return sock.getsockname()[0]
    except OSError:
        return None


def ib_hcas() -> tuple[str, ...]:
    return (
        tuple(sorted(os.listdir("/sys/class/infiniband")))
        if os.path.isdir("/sys/class/infiniband")
        else ()
    )


def facts(*, master_addr: str | None, probe_gpus: bool) -> Facts:
    nics = interfaces()
    master_ip = resolve(master_addr) if master_addr else None
    route = None
    if master_ip:
        local = source_address(master_ip)
        route = next((nic.name for nic in nics if local and nic.address == local), None)
    found, how = gpus() if probe_gpus else (None, "not probed: the GPU count was stated")
    return Facts(
        hostname=socket.gethostname(),
        python=sys.executable or "python3",
        cpu_count=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1,
        gpus=found,
        gpu_probe=how,
        interfaces=nics,
        route_to_master=route,
        default_route=default_route(),
        master_ip=master_ip,
        ib_hcas=ib_hcas(),
    )
