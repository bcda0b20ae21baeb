"""`entrypoint doctor`: the checks users ran by hand before a multi-node job (seed 000's
check_environment, seed 001's test_distributed), on one node, each problem with its fix.

    look()      the edge: imports torch and JAX, asks NVML, connects to the master's ports
    problems()  pure: plan, facts and findings in; one line per problem out
    report()    pure: one JSON-ready dict; table() renders it for a terminal

The plan and the facts come from the same code as `run` (node.prepare), so doctor shows what
`run` would do. `doctor --allreduce` runs entrypoint.job.allreduce as the trainer through
`run` on every node (join, fingerprints, supervision); global rank 0 prints the bandwidth.

Exit codes: 0 no problem, 1 problems found (or the all-reduce run's own code), 2 configuration
error (the same one-line error `run` gives).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
    driver: str | None = None  # NVIDIA driver version
    driver_cuda: str | None = None  # the newest CUDA the driver supports, "12.4"
    shm_bytes: int | None = None
    memlock_bytes: int | None = None  # None: unlimited
    run_dir_writable: bool = True
    data_dir_exists: bool | None = None  # None: no ENTRYPOINT_DATA_DIR
    ports: tuple[Port, ...] = field(default=())


# -- pure -----------------------------------------------------------------------------------


def _major(version: str | None) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _mib(nbytes: int) -> str:
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


def problems(plan, facts, found: Findings, settings) -> list[str]:
    """Each problem as one line: `<what>: <problem>. <fix>`."""
    from entrypoint import network
    from entrypoint.values import variable_of

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
        runtime, driver_cuda = _major(found.cuda_runtime), _major(found.driver_cuda)
        if runtime and driver_cuda and driver_cuda < runtime:
            out.append(
                f"NVIDIA driver {found.driver}: supports CUDA up to {found.driver_cuda}, "
                f"older than torch's CUDA runtime {found.cuda_runtime}. Install a driver "
                f"for CUDA {runtime}.x on the host (R525 or newer for CUDA 12)"
            )
        elif found.torch and found.torch_gpus == 0:
            out.append(
                f"torch {found.torch}: sees no GPU although the driver lists {gpus} "
                f"({facts.gpu_probe}). Give the container the driver's CUDA library "
                "(NVIDIA_DRIVER_CAPABILITIES=compute,utility, --gpus all) and check that "
                "CUDA_VISIBLE_DEVICES does not hide them"
            )
        if found.jax and found.jax_devices and not found.jax_devices.startswith(("gpu", "cuda")):
            out.append(
                f"JAX {found.jax}: sees only {found.jax_devices} although the driver lists "
                f"{gpus} GPUs. Install jax[cuda12] (the image has it) and leave "
                "JAX_PLATFORMS unset"
            )
    if facts.ib_hcas and plan.device == "cuda" and found.memlock_bytes is not None:
        out.append(
            f"ulimit -l (locked memory): {_mib(found.memlock_bytes)} with InfiniBand "
            f"{', '.join(facts.ib_hcas)}; NCCL's IB transport pins its buffers. Start the "
            "container with --ulimit memlock=-1 (Kubernetes: the runtime's memlock limit)"
        )
    if found.shm_bytes is not None and found.shm_bytes < SHM_MIN:
        out.append(
            f"/dev/shm: {_mib(found.shm_bytes)}, too small for NCCL and DataLoader "
            'workers ("Bus error"). Start the container with --shm-size=8g (Docker) or '
            "mount an emptyDir with medium: Memory at /dev/shm (Kubernetes)"
        )
    if not found.run_dir_writable:
        out.append(
            f"ENTRYPOINT_RUN_DIR={settings.run_dir}: not writable by this user "
            f"(uid {os.getuid()}). Point it at a writable directory"
        )
    if found.data_dir_exists is False:
        out.append(
            f"ENTRYPOINT_DATA_DIR={settings.data_dir}: does not exist on this node. "
            "Mount the dataset at the same path on every node"
        )
    names = [nic.name for nic in facts.interfaces]
    if settings.socket_ifname and settings.socket_ifname not in names:
        out.append(
            f"ENTRYPOINT_SOCKET_IFNAME={settings.socket_ifname}: no such interface on "
            f"this node (it has {', '.join(names) or 'none'}). Name one of them"
        )
    if plan.nnodes > 1:
        master_var = variable_of(plan.sources.get("master_addr", "env MASTER_ADDR"))
        if facts.master_ip is None:
            out.append(
                f"{master_var}={plan.master_addr}: does not resolve on this node. Use "
                "node 0's host name or IP; on Kubernetes a headless Service needs "
                "publishNotReadyAddresses: true, and the name resolves once node 0's pod "
                "runs"
            )
        iface, why = network.choose_interface(facts, settings)
        chosen_by_user = all(
            name in plan.sources and "set by you" in plan.sources[name]
            for name in network.IFNAME_VARS
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


def report(plan, facts, found: Findings, settings, found_problems: list[str]) -> dict:
    """Everything doctor says, as one JSON-ready dict."""
    from entrypoint import network

    iface, why = network.choose_interface(facts, settings)
    node0 = plan.node_rank == 0
    ports = []
    for port in found.ports:
        meaning, bad = port_meaning(port, node0)
        ports.append(
            {
                "name": port.name,
                "variable": port.variable,
                "port": port.port,
                "state": port.state,
                "meaning": meaning,
                "problem": bad,
            }
        )
    return {
        "node": {
            "hostname": facts.hostname,
            "node_rank": plan.node_rank,
            "nnodes": plan.nnodes,
            "platform": plan.platform,
        },
        "system": {
            "os": found.os,
            "kernel": found.kernel,
            "arch": found.arch,
            "python": found.python,
            "python_path": found.python_path,
            "image_lock": found.image_lock,
            "image_revision": found.image_revision,
        },
        "software": {
            "torch": found.torch,
            "torch_error": found.torch_error,
            "cuda_runtime": found.cuda_runtime,
            "torch_cuda_devices": found.torch_gpus,
            "jax": found.jax,
            "jax_devices": found.jax_devices,
            "jax_error": found.jax_error,
            "deepspeed": found.deepspeed,
            "nccl": found.nccl,
            "nccl_source": found.nccl_source,
        },
        "gpus": {
            "driver": found.driver,
            "driver_cuda": found.driver_cuda,
            "probe": facts.gpu_probe,
            "devices": [asdict(g) for g in facts.gpus or ()],
        },
        "network": {
            "interfaces": [asdict(nic) for nic in facts.interfaces],
            "chosen": iface,
            "why": why,
            "ib_hcas": list(facts.ib_hcas),
            "shm_bytes": found.shm_bytes,
        },
        "master": {
            "address": plan.master_addr,
            "resolved": facts.master_ip,
            "this_node": node0,
            "checked": plan.nnodes > 1,
            "ports": ports,
        },
        "plan": plan.to_dict(),
        "problems": list(found_problems),
        "ok": not found_problems,
        "allreduce": None,
    }


def table(rep: dict, plan_table: str) -> str:
    """The report for a terminal: sections of `name  value` lines, the plan, the problems."""
    s, sw, g, net, m, node = (
        rep["system"],
        rep["software"],
        rep["gpus"],
        rep["network"],
        rep["master"],
        rep["node"],
    )
    torch_line = (
        f"{sw['torch']} (CUDA runtime {sw['cuda_runtime'] or 'none'}), "
        f"GPUs seen: {sw['torch_cuda_devices']}"
        if sw["torch"]
        else f"does not import ({sw['torch_error']})"
    )
    rows: list[tuple[str, str]] = [
        ("system", ""),
        ("OS", f"{s['os']}, kernel {s['kernel']}, {s['arch']}"),
        ("Python", f"{s['python']} ({s['python_path']})"),
        (
            "image",
            f"lock {s['image_lock'][:12]}, revision {(s['image_revision'] or '?')[:12]}"
            if s["image_lock"]
            else "none (not running in the image)",
        ),
        ("software", ""),
        ("torch", torch_line),
        (
            "JAX",
            f"{sw['jax']}, devices: " + (sw["jax_devices"] or f"none ({sw['jax_error']})")
            if sw["jax"]
            else f"does not import ({sw['jax_error']})"
            if sw["jax_error"]
            else "not installed",
        ),
        ("DeepSpeed", sw["deepspeed"] or "not installed"),
        ("NCCL", f"{sw['nccl'] or 'not installed'} ({sw['nccl_source']})"),
        ("GPUs", ""),
        (
            "driver",
            f"{g['driver']} (CUDA {g['driver_cuda']})" if g["driver"] else f"none ({g['probe']})",
        ),
    ]
    for gpu in g["devices"]:
        memory = f", {gpu['memory_mib']} MiB" if gpu["memory_mib"] else ""
        rows.append((f"GPU {gpu['index']}", f"{gpu['name'] or 'unknown model'}{memory}"))
    if not g["devices"]:
        rows.append(("GPUs", "none: workers run on CPU (gloo)"))
    chosen = f"{net['chosen']} [{net['why']}]" if net["chosen"] else f"none [{net['why']}]"
    rows += [
        ("network", ""),
        (
            "interfaces",
            ", ".join(f"{n['name']} {n['address'] or '-'}" for n in net["interfaces"]) or "none",
        ),
        ("NCCL/gloo use", chosen if node["nnodes"] > 1 else "loopback (single node)"),
        ("InfiniBand", ", ".join(net["ib_hcas"]) or "none"),
        ("/dev/shm", _mib(net["shm_bytes"]) if net["shm_bytes"] is not None else "unknown"),
        ("master", ""),
    ]
    if m["checked"]:
        rows.append(
            (
                "address",
                f"{m['address']} -> {m['resolved'] or 'does not resolve'}"
                + (" (this node is node 0)" if m["this_node"] else ""),
            )
        )
        for port in m["ports"]:
            rows.append((f"{port['name']} port", f"{port['port']}: {port['meaning']}"))
    else:
        rows.append(("address", f"{m['address']} (single node: nothing to reach)"))
    width = max(len(name) for name, _ in rows)
    lines = [
        (
            f"entrypoint doctor: node {node['node_rank']} of {node['nnodes']} "
            f"({node['hostname']}), platform {node['platform']}"
        )
    ]
    for name, value in rows:
        lines.append(f"\n{name}" if not value else f"  {name:<{width}}  {value}")
    lines.append("\nplan")
    lines += [f"  {line}" if line else "" for line in plan_table.splitlines()]
    lines.append("\nproblems" + ("" if rep["problems"] else ": none"))
    lines += [f"  - {p}" for p in rep["problems"]]
    return "\n".join(lines)


# -- the edge -------------------------------------------------------------------------------


def _os_name() -> str:
    import platform

    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME", platform.system())
    except OSError:
        return platform.system()


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _writable(path: Path) -> bool:
    while not path.exists() and path != path.parent:
        path = path.parent
    return os.access(path, os.W_OK)


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")


def _torch(found: dict, has_gpus: bool) -> None:
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - any import failure is the finding
        found["torch_error"] = _error(err)
        return
    found["torch"], found["cuda_runtime"] = torch.__version__, torch.version.cuda
    available = bool(has_gpus and torch.version.cuda and torch.cuda.is_available())
    found["torch_gpus"] = torch.cuda.device_count() if available else 0
    if available:
        version = torch.cuda.nccl.version()
        found["nccl"] = (
            ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
        )
        found["nccl_source"] = "torch.cuda.nccl.version()"


def _jax(found: dict, has_gpus: bool) -> None:
    if not has_gpus:
        # Without a GPU, JAX's CUDA plugin prints a long traceback before falling back to CPU.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # a check, not a job
    try:
        import jax

        found["jax"] = jax.__version__
        counts = Counter(d.platform for d in jax.devices())
        found["jax_devices"] = ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))
    except Exception as err:  # noqa: BLE001
        if found.get("jax") is None and _dist_version("jax") is None:
            return  # not installed: nothing to report (outside the image)
        found["jax_error"] = _error(err)


def look(plan, facts, settings) -> Findings:
    import platform
    import resource

    from entrypoint import fingerprint, probe

    has_gpus = bool(facts.gpus)
    found: dict = {
        "os": _os_name(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "python_path": sys.executable,
        "image_lock": _read(fingerprint.IMAGE_DIR / "lock.sha256"),
        "image_revision": _read(fingerprint.IMAGE_DIR / "revision"),
        "deepspeed": _dist_version("deepspeed"),
    }
    _torch(found, has_gpus)
    if found.get("nccl") is None:
        found["nccl"] = _dist_version("nvidia-nccl-cu12")
        found["nccl_source"] = "nvidia-nccl-cu12 package" + ("" if has_gpus else "; no GPU here")
    _jax(found, has_gpus)
    if has_gpus:
        found["driver"], found["driver_cuda"] = probe.nvidia_driver()
    try:
        stat = os.statvfs("/dev/shm")
        found["shm_bytes"] = stat.f_blocks * stat.f_frsize
    except OSError:
        pass
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    found["memlock_bytes"] = None if soft == resource.RLIM_INFINITY else soft
    found["run_dir_writable"] = _writable(Path(settings.run_dir))
    if settings.data_dir is not None:
        found["data_dir_exists"] = Path(settings.data_dir).is_dir()
    ports = []
    if plan.nnodes > 1:
        for name, variable, port in (
            ("rendezvous", "MASTER_PORT", plan.master_port),
            ("control", "ENTRYPOINT_CONTROL_PORT", plan.control_port),
        ):
            if port is None:
                state = "not checked (no fixed port)"
            elif facts.master_ip is None:
                state = "not checked (the master's name does not resolve)"
            else:
                state = probe.tcp_connect(facts.master_ip, port, CONNECT_TIMEOUT)
            ports.append(Port(name, variable, port, state))
    found["ports"] = tuple(ports)
    return Findings(**found)


# -- the command ----------------------------------------------------------------------------


def allreduce_trainer(args) -> list[str]:
    from entrypoint.errors import ConfigError
    from entrypoint.plan import ALLREDUCE

    if args.iters is not None and args.iters < 1:
        raise ConfigError("--iters", args.iters, "must be at least 1", "Give --iters 5, say")
    try:
        sizes = [float(x) for x in (args.sizes or "1").split(",")]
    except ValueError:
        sizes = [0.0]
    if min(sizes) <= 0:
        raise ConfigError(
            "--sizes", args.sizes, "not a list of positive MiB figures", "Give --sizes 1,16,64, say"
        )

    trainer = [*ALLREDUCE, "--format", "none" if args.json else "table"]
    if args.sizes:
        trainer += ["--sizes", args.sizes]
    if args.iters is not None:
        trainer += ["--iters", str(args.iters)]
    return trainer


def cmd_doctor(args, env: Mapping[str, str]) -> int:
    from entrypoint import launch, node, secrets
    from entrypoint import report as plan_report

    plan, facts, settings = node.prepare(
        env, allreduce_trainer(args) if args.allreduce else None, always_probe_gpus=True
    )
    launch.check_hardware(plan, env, facts)
    found = look(plan, facts, settings)
    found_problems = problems(plan, facts, found, settings)
    values = secrets.secret_values(env)
    rep = report(plan, facts, found, settings, found_problems)
    if not args.json:
        print(secrets.mask(table(rep, plan_report.table(plan)), values), flush=True)
    code = 1 if found_problems else 0
    if args.allreduce:
        result = Path(settings.run_dir) / f"node{plan.node_rank}" / "allreduce.json"
        result.unlink(missing_ok=True)
        ran = node.run_plan(plan, facts, env, settings)
        try:
            rep["allreduce"] = json.loads(result.read_text())
        except (OSError, ValueError):
            rep["allreduce"] = None  # measured on another node (global rank 0's)
        code = ran or code
    if args.json:
        print(json.dumps(secrets.mask_data(rep, values), indent=2), flush=True)
    return code
