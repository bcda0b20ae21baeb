"""`entrypoint doctor`'s pure half: what the edge found on this node (`Findings`, plain values
that tests state) and the problems they add up to, one line each: `<what>: <problem>. <fix>`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from entrypoint.doctor.cuda_kernels import Kernels, coverage
from entrypoint.plan import network
from entrypoint.plan.values import Kind
from entrypoint.supervise.health_rules import driver_misfit

if TYPE_CHECKING:
    from entrypoint.plan.facts import Facts
    from entrypoint.plan.node_plan import Plan
    from entrypoint.plan.settings import Settings

SHM_MIN = 512 << 20  # below: NCCL and DataLoader workers fail ("Bus error"); Docker's is 64 MiB
CONNECT_TIMEOUT = 2.0  # seconds per port check


@dataclass(frozen=True)
class Port:
    name: str  # "rendezvous" (MASTER_PORT) or "control" (the entrypoints' channel)
    variable: str
    port: int | None
    state: str  # open, refused, timeout, unreachable (why), or "not checked (why)"


@dataclass(frozen=True)
class Findings:
    """What the edge found on this node, as plain values (tests state them)."""

    os: str = "unknown"
    kernel: str = ""
    arch: str = ""
    python: str = ""
    python_path: str = ""
    image_lock: str | None = None
    image_revision: str | None = None
    torch: str | None = None  # None: does not import (torch_error says why)
    torch_error: str | None = None
    cuda_runtime: str | None = None  # torch.version.cuda
    torch_gpus: int = 0  # devices torch sees (0 when CUDA is not available)
    nccl: str | None = None
    nccl_source: str = ""
    jax: str | None = None
    jax_devices: str | None = None  # "gpu x8", "cpu x1"
    jax_error: str | None = None
    deepspeed: str | None = None
    gpu_capabilities: tuple[str, ...] = ()  # this node's GPUs' compute capabilities, "9.0"
    cuda_ops: tuple[Kernels, ...] = ()  # DeepSpeed's prebuilt CUDA ops and their archs
    driver: str | None = None  # NVIDIA driver version
    driver_cuda: str | None = None  # the newest CUDA the driver supports, "12.4"
    shm_bytes: int | None = None
    memlock_bytes: int | None = None  # None: unlimited
    run_dir_writable: bool = True
    health: tuple[str, ...] = ()  # the checks before a start that failed (supervise/health.py)
    ports: tuple[Port, ...] = field(default=())


# -- pure -----------------------------------------------------------------------------------


def mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB" if nbytes >= 1 << 30 else f"{nbytes >> 20} MiB"


def port_meaning(port: Port, node0: bool) -> tuple[str, bool]:
    """(what the state means here, whether it is a problem)."""
    state = port.state
    if state.startswith("not checked"):
        return state, False
    if node0:
        if state == "open":
            return (
                "something listens already: a running `entrypoint run` on this node, or "
                "another program that would keep `run` from using the port"
            ), False
        if state == "refused":
            return "not listening yet: this is node 0, `entrypoint run` opens it", False
    else:
        if state == "open":
            return "open: node 0 answers", False
        if state == "refused":
            return (
                "node 0 is reachable, nothing listens yet (its `entrypoint run` has not "
                "started; `run` here waits for it)"
            ), False
    if state == "timeout":
        return f"no answer within {CONNECT_TIMEOUT:g} s", True
    return state, True


def problems(plan: Plan, facts: Facts, found: Findings, settings: Settings) -> list[str]:
    """Each problem as one line: `<what>: <problem>. <fix>`."""
    return (
        software_problems(facts, found)
        + node_problems(plan, facts, found, settings)
        + (network_problems(plan, facts, found, settings) if plan.nnodes > 1 else [])
    )


def software_problems(facts: Facts, found: Findings) -> list[str]:
    """torch, JAX and the driver against the GPUs the node has."""
    out: list[str] = []
    gpus = len(facts.gpus or ())
    if found.torch is None:
        out.append(
            f"torch: does not import ({found.torch_error}). Run the image's Python "
            f"({found.python_path}) or reinstall torch from the image's lock"
        )
    if found.jax is None and found.jax_error:
        out.append(
            f"JAX: does not import ({found.jax_error}). Run the image's Python or "
            "reinstall jax from the image's lock"
        )
    elif found.jax and found.jax_error:
        out.append(
            f"JAX {found.jax}: jax.devices() failed ({found.jax_error}). If a job holds "
            "the GPUs, run doctor before it starts; else check the driver (nvidia-smi)"
        )
    if gpus:
        misfit = driver_fit(found)
        if misfit:
            out.append(misfit)
        elif found.torch and found.torch_gpus == 0:
            out.append(
                f"torch {found.torch}: sees no GPU although the driver lists {gpus} "
                f"({facts.gpu_probe}). Give the container the driver's CUDA library "
                "(NVIDIA_DRIVER_CAPABILITIES=compute,utility, --gpus all) and check that "
                "CUDA_VISIBLE_DEVICES does not hide them"
            )
        out += kernel_problems(found)
        if found.jax and found.jax_devices and not found.jax_devices.startswith(("gpu", "cuda")):
            out.append(
                f"JAX {found.jax}: sees only {found.jax_devices} although the driver lists "
                f"{gpus} GPUs. Install jax[cuda12] (the image has it) and leave "
                "JAX_PLATFORMS unset"
            )
    return out


def driver_fit(found: Findings) -> str | None:
    """The node's driver against the image's CUDA: which image fits, or which driver."""
    if not (found.driver and found.driver_cuda and found.cuda_runtime):
        return None
    whole, _, minor = found.driver_cuda.partition(".")
    try:
        cuda = int(whole) * 1000 + int(minor or 0) * 10
    except ValueError:
        return None
    misfit = driver_misfit(cuda, found.cuda_runtime)
    if misfit is None:
        return None
    reason, fix = misfit
    return f"NVIDIA driver {found.driver}: {reason}. {fix[:1].upper()}{fix[1:]}"


def kernel_problems(found: Findings) -> list[str]:
    """A prebuilt CUDA op with neither a cubin nor PTX for one of this node's GPUs."""
    return [
        f"DeepSpeed's {ops.op}: no kernel for this node's GPUs (compute capability {cap}); "
        f"the image's holds {ops.text()}, so a config that selects it fails on every rank. "
        f'Rebuild the image with {cap} in its list: make image TORCH_CUDA_ARCH_LIST="...;{cap}"'
        for cap in found.gpu_capabilities
        for ops in found.cuda_ops
        if coverage(cap, ops) == "none"
    ]


def node_problems(plan: Plan, facts: Facts, found: Findings, settings: Settings) -> list[str]:
    """Limits, directories and the interface setting of this node."""
    out: list[str] = []
    if facts.ib_hcas and plan.device == "cuda" and found.memlock_bytes is not None:
        out.append(
            f"ulimit -l (locked memory): {mib(found.memlock_bytes)} with InfiniBand "
            f"{', '.join(facts.ib_hcas)}; NCCL's IB transport pins its buffers. Start the "
            "container with --ulimit memlock=-1 (Kubernetes: the runtime's memlock limit)"
        )
    if found.shm_bytes is not None and found.shm_bytes < SHM_MIN:
        out.append(
            f"/dev/shm: {mib(found.shm_bytes)}, too small for NCCL and DataLoader "
            'workers ("Bus error"). Start the container with --shm-size=8g (Docker) or '
            "mount an emptyDir with medium: Memory at /dev/shm (Kubernetes)"
        )
    if not found.run_dir_writable:
        out.append(
            f"ENTRYPOINT_RUN_DIR={settings.run_dir}: not writable by this user "
            f"(uid {os.getuid()}). Point it at a writable directory"
        )
    out += list(found.health)
    names = [nic.name for nic in facts.interfaces]
    if settings.socket_ifname and settings.socket_ifname not in names:
        out.append(
            f"ENTRYPOINT_SOCKET_IFNAME={settings.socket_ifname}: no such interface on "
            f"this node (it has {', '.join(names) or 'none'}). Name one of them"
        )
    return out


def network_problems(plan: Plan, facts: Facts, found: Findings, settings: Settings) -> list[str]:
    """Between the nodes: the master's name, an interface, node 0's ports."""
    out: list[str] = []
    source = plan.sources.get("master_addr")
    master_var = source.names("MASTER_ADDR") if source is not None else "MASTER_ADDR"
    if facts.master_ip is None:
        out.append(
            f"{master_var}={plan.master_addr}: does not resolve on this node. Use "
            "node 0's host name or IP; on Kubernetes a headless Service needs "
            "publishNotReadyAddresses: true, and the name resolves once node 0's pod "
            "runs"
        )
    iface, why = network.choose_interface(facts, settings)
    chosen_by_user = all(
        name in plan.sources and plan.sources[name].kind is Kind.ENV for name in network.IFNAME_VARS
    )
    if iface is None and not chosen_by_user:
        out.append(
            f"network interface: none found for traffic between nodes ({why}). Set "
            "ENTRYPOINT_SOCKET_IFNAME to the interface that reaches the other nodes"
        )
    node0 = plan.node_rank == 0
    for port in found.ports:
        meaning, bad = port_meaning(port, node0)
        if bad:
            out.append(
                f"{port.variable}={port.port}: {meaning} from {plan.master_addr} "
                f"({facts.master_ip}). Open TCP ports {plan.master_port} and "
                f"{plan.control_port} on node 0 to the other nodes (firewall, "
                "security group, NetworkPolicy)"
            )
    return out
