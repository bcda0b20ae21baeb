"""`entrypoint doctor`: the checks users ran by hand before a multi-node job (an environment
check script, a test all-reduce), on one node, each problem with its fix.

    look()      the edge (here): imports torch and JAX, asks NVML, connects to the master's ports
    problems()  pure (doctor_checks.py): plan, facts and findings in; one line per problem out
    report()    pure (doctor_report.py): one JSON-ready dict; table() renders it for a terminal

The plan and the facts come from the same code as `run` (node.prepare), so doctor shows what
`run` would do. `doctor --allreduce` runs entrypoint.job.allreduce as the trainer through
`run` on every node (join, fingerprints, supervision); global rank 0 prints the bandwidth.

Exit codes: 0 no problem, 1 problems found (or the all-reduce run's own code), 2 configuration
error (the same one-line error `run` gives).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import sys
from collections import Counter
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from entrypoint.doctor import cuda_kernels
from entrypoint.doctor.doctor_checks import CONNECT_TIMEOUT, Findings, Port, problems
from entrypoint.doctor.doctor_report import report, table
from entrypoint.plan import secrets
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.node_plan import ALLREDUCE
from entrypoint.supervise import health, node, preflight, probe
from entrypoint.supervise import report as plan_report

if TYPE_CHECKING:
    from entrypoint.plan.facts import Facts
    from entrypoint.plan.node_plan import Plan
    from entrypoint.plan.settings import Settings

# -- the edge -------------------------------------------------------------------------------


def _os_name() -> str:
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
        found["gpu_capabilities"] = tuple(
            sorted(
                {
                    "{}.{}".format(*torch.cuda.get_device_capability(i))
                    for i in range(found["torch_gpus"])
                },
                key=cuda_kernels.capability_arch,
            )
        )
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


def look(plan: Plan, facts: Facts, settings: Settings) -> Findings:
    has_gpus = bool(facts.gpus)
    found: dict = {
        "os": _os_name(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "python_path": sys.executable,
        "image_lock": _read(probe.IMAGE_DIR / "lock.sha256"),
        "image_revision": _read(probe.IMAGE_DIR / "revision"),
        "deepspeed": _dist_version("deepspeed"),
        "cuda_ops": cuda_kernels.deepspeed_ops(),
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
    # the checks before every start, bounded: a hung data mount fails, it does not hang doctor
    found["health"] = tuple(f.line() for f in health.checks(plan, settings, restart=False))
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
                # Every address the name has, IPv6 and IPv4, as a node joins.
                state = probe.tcp_connect(plan.master_addr, port, CONNECT_TIMEOUT)
            ports.append(Port(name, variable, port, state))
    found["ports"] = tuple(ports)
    return Findings(**found)


# -- the command ----------------------------------------------------------------------------


MAX_SIZE_MIB = 65_536  # 64 GiB: an all-reduce tensor above the memory of any GPU sold today
MAX_SIZES = 32
MAX_ITERS = 10_000
_SIZE = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6})?\Z")  # ASCII: float() takes nan, inf, 1_0, ١


def _sizes(text: str | None) -> list[float]:
    """--sizes as MiB figures, each above 0 and at most MAX_SIZE_MIB; else one line, exit 2."""
    words = (text or "1").split(",")
    sizes = [float(w) for w in words if _SIZE.match(w.strip())]
    if len(sizes) == len(words) <= MAX_SIZES and 0 < min(sizes) and max(sizes) <= MAX_SIZE_MIB:
        return sizes
    raise ConfigError(
        "--sizes",
        text,
        f"not a list of positive MiB figures (at most {MAX_SIZES}, each at most {MAX_SIZE_MIB:,})",
        "Give --sizes 1,16,64, say",
    )


def allreduce_trainer(args: argparse.Namespace) -> list[str]:
    if args.iters is not None and not 1 <= args.iters <= MAX_ITERS:
        raise ConfigError(
            "--iters",
            args.iters,
            f"must be at least 1 and at most {MAX_ITERS:,}",
            "Give --iters 5, say",
        )
    _sizes(args.sizes)

    trainer = [*ALLREDUCE, "--format", "none" if args.json else "table"]
    if args.sizes:
        trainer += ["--sizes", args.sizes]
    if args.iters is not None:
        trainer += ["--iters", str(args.iters)]
    return trainer


def cmd_doctor(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    plan, facts, settings = node.prepare(
        env, allreduce_trainer(args) if args.allreduce else None, always_probe_gpus=True
    )
    # What `run` refuses (GPUs promised that the node does not see) is doctor's finding: a
    # problem in the report with its fix, exit 1, not a refusal.
    try:
        preflight.check_hardware(plan, env, facts)
        unfit: list[str] = []
    except ConfigError as err:
        unfit = [err.line()]
    found = look(plan, facts, settings)
    found_problems = unfit + problems(plan, facts, found, settings)
    values = secrets.secret_values(env)
    rep = report(plan, facts, found, settings, found_problems)
    if not args.json:
        print(secrets.mask(table(rep, plan_report.table(plan)), values), flush=True)
    code = 1 if found_problems else 0
    if args.allreduce and not unfit:
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
