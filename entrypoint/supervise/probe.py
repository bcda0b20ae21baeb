"""The edge that looks at the machine: GPUs (NVML, /proc/driver/nvidia, nvidia-smi), network
interfaces, routes, DNS, InfiniBand, and this node's fingerprint (the image, packages, driver,
data) that node 0 compares. Each probe is small and returns plain values (facts.py)."""

from __future__ import annotations

import dataclasses
import fcntl
import glob
import importlib.util
import ipaddress
import os
import platform
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from entrypoint.control import sockets
from entrypoint.control.node_fingerprint import DataSummary, Fingerprint
from entrypoint.plan import launch_lines
from entrypoint.plan.facts import Facts, Gpu, Interface
from entrypoint.supervise.health_rules import torch_cuda

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
    ipv6 = _ipv6_addresses()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
                address = socket.inet_ntoa(packed[20:24])
            except OSError:
                address = ""
            found.append(Interface(name, address, tuple(ipv6.get(name, ()))))
    return tuple(found)


def _hex_ip(text: str) -> str:
    """/proc/net's 32 hex digits as an IPv6 address."""
    return str(ipaddress.IPv6Address(bytes.fromhex(text)))


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:  # absent: no IPv6 (or no IPv4 routes) on this host
        return ""


def ipv6_addresses(if_inet6: str) -> dict[str, list[str]]:
    """Each interface's IPv6 addresses, from /proc/net/if_inet6's text."""
    out: dict[str, list[str]] = {}
    for line in if_inet6.splitlines():
        fields = line.split()
        if len(fields) == 6 and len(fields[0]) == 32:
            try:
                out.setdefault(fields[5], []).append(_hex_ip(fields[0]))
            except ValueError:
                continue
    return out


def _ipv6_addresses() -> dict[str, list[str]]:
    return ipv6_addresses(_read("/proc/net/if_inet6"))


_RTF_UP, _RTF_REJECT = 0x0001, 0x0200


def ipv4_default(route: str) -> str | None:
    """The interface of the IPv4 default route, from /proc/net/route's text."""
    for line in route.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def ipv6_default(ipv6_route: str) -> str | None:
    """The interface of the IPv6 default route (::/0, up, not the kernel's reject route on
    lo), from /proc/net/ipv6_route's text."""
    for line in ipv6_route.splitlines():
        fields = line.split()
        if len(fields) == 10 and fields[0] == "0" * 32 and fields[1] == "00":
            try:
                flags = int(fields[8], 16)
            except ValueError:
                continue
            if flags & _RTF_UP and not flags & _RTF_REJECT and fields[9] != "lo":
                return fields[9]
    return None


def default_route() -> str | None:
    """The interface of the IPv4 default route, else of the IPv6 one."""
    return ipv4_default(_read("/proc/net/route")) or ipv6_default(_read("/proc/net/ipv6_route"))


def resolve(name: str) -> str | None:
    """The master's first address, either family, in the resolver's order (RFC 6724)."""
    try:
        found = sockets.addresses(name, 0)
    except (OSError, UnicodeError):
        return None
    return sockets.bare_ip(str(found[0][1][0])) if found else None


def tcp_connect(host: str, port: int, timeout: float = 2.0) -> str:
    """`open`, `refused`, `timeout` or `unreachable (why)`: a plain TCP connect to each of the
    host's addresses in turn (as a node joins), nothing sent."""
    try:
        sockets.connect(host, port, timeout).close()
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


def image_cuda() -> str | None:
    """The CUDA version of the torch beside this entrypoint, from torch/version.py: read, not
    imported (a second or more); None for a CPU torch or none."""
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None
        text = Path(next(iter(spec.submodule_search_locations)), "version.py").read_text()
    except (OSError, ImportError, ValueError):
        return None
    return torch_cuda(text)


def source_address(ip: str) -> str | None:
    """The local address the kernel would use to reach ip (a UDP connect sends nothing)."""
    try:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
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


def master_route(
    master_addr: str | None, nics: Sequence[Interface]
) -> tuple[str | None, str | None]:
    """(the master's address, the interface this node reaches it through), each None unknown."""
    master_ip = resolve(master_addr) if master_addr else None
    route = None
    if master_ip:
        local = source_address(master_ip)
        local = sockets.bare_ip(local.split("%")[0]) if local else None
        route = next(
            (nic.name for nic in nics if local and local in (nic.address, *nic.ipv6)), None
        )
    return master_ip, route


def master_resolved(facts: Facts, master_addr: str, waited: float) -> Facts:
    """`facts` with the master's address and route probed again, `waited` seconds after the
    first probe (a name that did not resolve then)."""
    master_ip, route = master_route(master_addr, facts.interfaces)
    if master_ip is None:
        return facts
    return dataclasses.replace(
        facts, master_ip=master_ip, route_to_master=route, master_resolved_after=waited
    )


def launch_config(command: Sequence[str] | None) -> str | None:
    """The text of the accelerate config file the command's launch line names; None when it
    names none or the file cannot be read (the plan says so, naming it)."""
    path = launch_lines.config_file(command)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def facts(
    *, master_addr: str | None, probe_gpus: bool, command: Sequence[str] | None = None
) -> Facts:
    nics = interfaces()
    master_ip, route = master_route(master_addr, nics)
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
        launch_config=launch_config(command),
    )


# -- the fingerprint ----------------------------------------------------------------------

# Written by docker/Dockerfile; absent outside the image.
IMAGE_DIR = Path(os.environ.get("ENTRYPOINT_IMAGE_DIR", "/opt/venv/share/entrypoint"))
_HEADLINE = {"torch": "torch", "jax": "jax", "deepspeed": "deepspeed", "nccl": "nvidia-nccl-cu12"}


def _image_file(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _headers(path: str) -> tuple[str, str]:
    """(Name, Version) from a METADATA or PKG-INFO file's header lines."""
    name = version = ""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the headers end at the first blank line; the description follows
                if line.startswith("Name:"):
                    name = line[5:].strip()
                elif line.startswith("Version:"):
                    version = line[8:].strip()
                if name and version:
                    break
    except OSError:
        pass
    return name, version


def packages(paths: list[str] | None = None) -> dict[str, str]:
    """name -> version of every installed distribution: the Name and Version headers of each
    *.dist-info/METADATA and *.egg-info on sys.path, first found wins, as importlib.metadata
    finds them. No imports, and no email parser (importlib.metadata's was 90% of the join's
    time: 80 ms a node, seconds when 32 nodes share a machine)."""
    found: dict[str, str] = {}
    for entry in sys.path if paths is None else paths:
        try:
            items = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for item in items:
            where = os.path.join(entry or ".", item)
            if item.endswith(".dist-info"):
                meta = os.path.join(where, "METADATA")
            elif item.endswith(".egg-info"):
                meta = where if os.path.isfile(where) else os.path.join(where, "PKG-INFO")
            else:
                continue
            name, version = _headers(meta)
            key = name.lower().replace("_", "-")
            if key and key not in found:
                found[key] = version
    return dict(sorted(found.items()))


def cuda_driver_major() -> str | None:
    """The driver's CUDA major version (NVML), or None without a driver."""
    try:
        import pynvml  # present only where an NVIDIA driver may be; failing is the answer

        pynvml.nvmlInit()
        try:
            return str(pynvml.nvmlSystemGetCudaDriverVersion() // 1000)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver library or no device: nothing to compare
        return None


def data_summary(path: Path | None, *, limit: int = 200_000) -> DataSummary | None:
    """File count and total size of a dataset directory (None when none is configured)."""
    if path is None:
        return None
    if not path.is_dir():
        return DataSummary(str(path), False)
    files = size = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                size += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
            files += 1
            if files >= limit:  # a huge tree: compare what was counted, and say so
                return DataSummary(str(path), True, files, size, partial=True)
    return DataSummary(str(path), True, files, size)


def fingerprint(
    *, gpus_per_node: int, gpu_names: tuple[str, ...], data_dir: Path | None
) -> Fingerprint:
    """This node's fingerprint: reads the image's files, the package metadata and NVML."""
    pkgs = packages()
    headline = {field: pkgs.get(dist, "not installed") for field, dist in _HEADLINE.items()}
    return Fingerprint(
        image_lock=_image_file(IMAGE_DIR / "lock.sha256") or "none (not in the image)",
        image_revision=_image_file(IMAGE_DIR / "revision") or "unknown",
        python=platform.python_version(),
        torch=headline["torch"],
        jax=headline["jax"],
        deepspeed=headline["deepspeed"],
        nccl=headline["nccl"],
        cuda_driver=cuda_driver_major() if gpus_per_node else "none (CPU)",
        gpu_model=", ".join(sorted(set(gpu_names))) or ("unknown" if gpus_per_node else "none"),
        gpus_per_node=gpus_per_node,
        packages=pkgs,
        data=data_summary(data_dir),
    )
