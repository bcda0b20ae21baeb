"""One builder per launcher: a decided `Layout` and the trainer in, a `LaunchSpec` out (the
command, the variables and files it needs, the port it uses, and why).

    torchrun    the entrypoint spawns one worker per GPU (or per CPU worker) through torchrun
    accelerate  the same through `accelerate launch`, with the accelerate config written here
    jax         one process per node owns all its GPUs (jax.distributed)
    direct      the platform already started every process; it becomes the worker

Pure: nothing here reads the environment or the machine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from entrypoint.plan.configs import Config
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.launch_lines import Adopted
from entrypoint.plan.settings import PREFIX, Settings
from entrypoint.plan.values import Source, Sourced, by_default, derived, env_var
from entrypoint.trainer_side import accelerate_config


class Launcher(StrEnum):
    TORCHRUN = "torchrun"
    ACCELERATE = "accelerate"
    JAX = "jax"
    DIRECT = "direct"

    @property
    def spawns(self) -> bool:
        """Whether it starts the workers (through torchrun's agent) rather than being one."""
        return self in (Launcher.TORCHRUN, Launcher.ACCELERATE)


# `entrypoint doctor --allreduce`'s trainer, and what ENTRYPOINT_PREFLIGHT_ALLREDUCE runs first.
ALLREDUCE = ("python", "-m", "entrypoint.job.allreduce")


@dataclass(frozen=True)
class Layout:
    """Where this node stands, decided: what every builder reads."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    standalone: bool  # one node and no port stated: torchrun picks a free one
    spawn: bool
    rank: int | None
    local_rank: int | None
    gpus_per_node: int
    cuda_visible: str | None
    python: str
    run_dir: str

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


@dataclass(frozen=True)
class LaunchSpec:
    """What a builder decided: the command, the variables and files it needs, the port it
    uses (None: torchrun picks one), and why, by plan key."""

    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    master_port: int | None = None
    sources: dict[str, Source] = field(default_factory=dict)


def choose(settings: Settings, spawn: bool, builtin_jax: bool) -> Sourced[Launcher]:
    """ENTRYPOINT_LAUNCHER, else jax for the built-in JAX job, else by who starts processes.

    Args:
        settings: the ENTRYPOINT_* settings (`launcher`).
        spawn: whether the entrypoint starts the workers (False: the platform started them).
        builtin_jax: whether the trainer is the image's built-in JAX job.

    Returns:
        The launcher and its source.

    Raises:
        ConfigError: ENTRYPOINT_LAUNCHER names a spawning launcher where the platform already
            started every process.
    """
    if settings.launcher == "auto" and builtin_jax:
        return Sourced(Launcher.JAX, derived(f"the built-in JAX job ({PREFIX}JOB=jax)"))
    if settings.launcher != "auto":
        launcher = Launcher(settings.launcher)
        if launcher.spawns and not spawn:
            raise ConfigError(
                f"{PREFIX}LAUNCHER",
                settings.launcher,
                "the platform already started one process per GPU, nothing to spawn",
                f"Unset {PREFIX}LAUNCHER, or start one task per node",
            )
        return Sourced(launcher, env_var(f"{PREFIX}LAUNCHER"))
    why = by_default(
        "default: torchrun spawns the workers"
        if spawn
        else "default: the platform started every process; exec directly"
    )
    return Sourced(Launcher.TORCHRUN if spawn else Launcher.DIRECT, why)


def preflight(
    trainer: tuple[str, ...], settings: Settings, launcher: Launcher
) -> Sourced[tuple[str, ...]] | None:
    """ENTRYPOINT_PREFLIGHT_ALLREDUCE: each worker measures all-reduce bandwidth, then execs
    the trainer in the same process. Only torchrun's agent store outlives that measurement.

    Args:
        trainer: the trainer's command.
        settings: the ENTRYPOINT_* settings (`preflight_allreduce`).
        launcher: the launcher chosen.

    Returns:
        The trainer behind the measurement and its source; None when it runs as it is.

    Raises:
        ConfigError: the measurement is asked for with a launcher that starts no torchrun.
    """
    if not settings.preflight_allreduce or tuple(trainer[:3]) == ALLREDUCE:
        return None
    if not launcher.spawns:
        raise ConfigError(
            f"{PREFIX}PREFLIGHT_ALLREDUCE",
            "true",
            "measures in the workers torchrun starts, then execs the trainer in "
            f"them; the {launcher} launcher starts no torchrun",
            "Unset it, and measure the nodes first with `entrypoint doctor --allreduce`",
        )
    why = derived(
        f"env {PREFIX}PREFLIGHT_ALLREDUCE: each worker measures "
        "all-reduce bandwidth, then execs the trainer"
    )
    return Sourced((*ALLREDUCE, "--then", *trainer), why)


def script_args(trainer: Sequence[str], python: str) -> list[str]:
    """torchrun runs a script with its own Python: `python x.py` -> `x.py`, `python -m m` ->
    `--module m`; other interpreter options (`python -c CODE`, `python -u x.py`) keep the
    interpreter: `--no-python <python> -c CODE`."""
    head, rest = trainer[0], list(trainer[1:])
    if os.path.basename(head).startswith("python") and rest:
        if rest[0] == "-m":
            return ["--module", *rest[1:]]
        return ["--no-python", python, *rest] if rest[0].startswith("-") else rest
    if head.endswith(".py"):
        return list(trainer)
    return ["--no-python", *trainer]


def torchrun(layout: Layout, trainer: Sequence[str]) -> LaunchSpec:
    # Restarts are the entrypoint's (all nodes together); torchrun keeps each rank's
    # stderr in logs/ (the failing rank's traceback is shown once, at node 0) and on screen.
    if layout.standalone:
        rendezvous, env, port = ["--standalone"], {}, None
        sources = {"master_port": derived("torchrun --standalone picks a free port")}
    else:
        rendezvous = [f"--master-addr={layout.master_addr}", f"--master-port={layout.master_port}"]
        env, port, sources = {"MASTER_PORT": str(layout.master_port)}, layout.master_port, {}
    command = (
        layout.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={layout.nnodes}",
        f"--node-rank={layout.node_rank}",
        f"--nproc-per-node={layout.nproc_per_node}",
        *rendezvous,
        "--max-restarts=0",
        f"--log-dir={layout.run_dir}/logs",
        "--redirects=3",  # every worker's stdout and stderr in files: the entrypoint passes them on
        *script_args(trainer, layout.python),
    )
    return LaunchSpec(command, env, {}, port, sources)


def accelerate(
    layout: Layout, trainer: Sequence[str], config: Config, deepspeed: Mapping[str, object] | None
) -> LaunchSpec:
    path = f"{layout.run_dir}/accelerate.yaml"
    args = list(trainer) if trainer[0].endswith(".py") else script_args(trainer, layout.python)
    files = {path: accelerate_yaml(layout, config)}
    if deepspeed is not None:
        # The trainer builds its own optimizer and scheduler (accelerate's quick tour, the HF
        # Trainer); accelerate refuses one in the DeepSpeed config as well.
        kept = {k: v for k, v in deepspeed.items() if k not in ("optimizer", "scheduler")}
        files[accelerate_deepspeed(layout)] = json.dumps(kept, indent=2) + "\n"
    return LaunchSpec(
        (layout.python, "-m", "accelerate.commands.launch", "--config_file", path, *args),
        {"MASTER_PORT": str(layout.master_port), "ENTRYPOINT_ACCELERATE_CONFIG": path},
        files,
        layout.master_port,
        {
            "accelerate.yaml": derived(
                "the config's accelerate settings, this cluster's numbers; its "
                "DeepSpeed config without optimizer and scheduler (the trainer's own)"
            )
        },
    )


def accelerate_adopted(layout: Layout, trainer: Sequence[str], adopted: Adopted) -> LaunchSpec:
    """A user's `accelerate launch` line: their config file's settings and their options, with
    this cluster's numbers (launch_lines; the settings as trainer_side/accelerate_config.py
    writes them for a line a start script runs, too)."""
    path = f"{layout.run_dir}/accelerate.yaml"
    args = list(trainer) if trainer[0].endswith(".py") else script_args(trainer, layout.python)
    try:
        body, note = accelerate_config.for_node(
            adopted.config, _numbers(layout), layout.cuda_visible is None, adopted.config_file
        )
    except accelerate_config.CannotRun as refused:
        raise ConfigError(*refused.args) from None
    head = f"# Written by the entrypoint for this node from {adopted.config_file or 'no file'}"
    return LaunchSpec(
        (
            layout.python,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            path,
            *adopted.options,
            *args,
        ),
        {"MASTER_PORT": str(layout.master_port), "ENTRYPOINT_ACCELERATE_CONFIG": path},
        {
            path: f"{head}, with this cluster's numbers; do not edit.\n"
            + accelerate_config.as_yaml(body)
        },
        layout.master_port,
        {
            "accelerate.yaml": derived(
                (f"your {adopted.config_file}" if adopted.config_file else "your launch line")
                + " with this cluster's numbers (machines, machine rank, main process, processes)"
                + note
            )
        },
    )


def _numbers(layout: Layout) -> accelerate_config.Numbers:
    return accelerate_config.Numbers(
        layout.nnodes,
        layout.node_rank,
        layout.world_size,
        layout.nproc_per_node,
        layout.master_addr,
        layout.master_port,
    )


def accelerate_deepspeed(layout: Layout) -> str:
    return f"{layout.run_dir}/accelerate-deepspeed.json"


def accelerate_yaml(layout: Layout, config: Config) -> str:
    """accelerate's config for this node: the config's own settings, the cluster's numbers."""
    body = dict(config.accelerate)
    body["deepspeed_config"] = dict(
        body.get("deepspeed_config", {}), deepspeed_config_file=accelerate_deepspeed(layout)
    )
    body |= accelerate_config.cluster_numbers(_numbers(layout))
    return "# Written by the entrypoint for this node; do not edit.\n" + accelerate_config.as_yaml(
        body
    )


def worker(layout: Layout, trainer: Sequence[str]) -> LaunchSpec:
    """jax and direct: this process is the worker, placed by torch's and JAX's variables.

    jax.distributed.initialize() with no arguments: JAX reads JAX_COORDINATOR_ADDRESS and
    JAX_LOCAL_DEVICE_IDS itself, and the count and id through jax_cluster's ClusterEnv, which
    the site hook registers (plan.py puts it on PYTHONPATH) (the ids also keep JAX's SLURM/Open
    MPI readers from narrowing each process to GPU SLURM_LOCALID)."""
    rank = layout.node_rank if layout.spawn else layout.rank
    local_rank = 0 if layout.spawn else layout.local_rank
    host = f"[{layout.master_addr}]" if ":" in layout.master_addr else layout.master_addr
    out = {
        "MASTER_PORT": str(layout.master_port),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(layout.world_size),
        "LOCAL_WORLD_SIZE": str(layout.nproc_per_node),
        "NODE_RANK": str(layout.node_rank),
        "JAX_COORDINATOR_ADDRESS": f"{host}:{layout.master_port}",
        "JAX_NUM_PROCESSES": str(layout.world_size),
        "JAX_PROCESS_ID": str(rank),
    }
    sources: dict[str, Source] = {}
    if layout.cuda_visible is not None:
        ids = range(layout.gpus_per_node) if layout.spawn else [local_rank]
        out["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(i) for i in ids)
        sources["JAX_LOCAL_DEVICE_IDS"] = derived(
            "every GPU of this node" if layout.spawn else "this process's LOCAL_RANK"
        )
    command = list(trainer)
    if command[0] == "python":
        command[0] = layout.python
    return LaunchSpec(tuple(command), out, {}, layout.master_port, sources)


def build(
    launcher: Launcher,
    layout: Layout,
    trainer: Sequence[str],
    config: Config,
    deepspeed: Mapping[str, object] | None,
    adopted: Adopted | None = None,
) -> LaunchSpec:
    if launcher is Launcher.TORCHRUN:
        return torchrun(layout, trainer)
    if launcher is Launcher.ACCELERATE and adopted is not None:
        return accelerate_adopted(layout, trainer, adopted)
    if launcher is Launcher.ACCELERATE:
        return accelerate(layout, trainer, config, deepspeed)
    return worker(layout, trainer)


@dataclass(frozen=True)
class Timeouts:
    """What `timeouts` decided: the variables it sets, each timeout and its source."""

    env: Mapping[str, str]  # ENTRYPOINT_COLLECTIVE_TIMEOUT, and DEEPSPEED_TIMEOUT unless set
    collective: Sourced[int]  # ENTRYPOINT_COLLECTIVE_TIMEOUT, in seconds
    deepspeed: Sourced[str]  # DEEPSPEED_TIMEOUT, in minutes: the user's, kept, else derived
    warnings: tuple[str, ...] = ()


def timeouts(env: Mapping[str, str], settings: Settings, launcher: Launcher) -> Timeouts:
    """One collective timeout for every library, so that a stuck rank surfaces in a known time
    and no library's own default (DeepSpeed 0.19: 10 min; accelerate: 30 min on gloo) comes
    back silently. Node loss does not wait for these: the entrypoints' heartbeats catch it.

    Args:
        env: the node's environment (a DEEPSPEED_TIMEOUT there is kept).
        settings: the ENTRYPOINT_* settings (`collective_timeout`).
        launcher: the launcher chosen (accelerate's own timeout is warned about).

    Returns:
        The variables to set, each timeout with its source, and the warnings.
    """
    seconds = settings.collective_timeout
    out = {"ENTRYPOINT_COLLECTIVE_TIMEOUT": str(seconds)}
    collective = Sourced(
        seconds,
        env_var(f"{PREFIX}COLLECTIVE_TIMEOUT")
        if "collective_timeout" in settings.model_fields_set
        else by_default(f"default {seconds} s"),
    )
    if "DEEPSPEED_TIMEOUT" in env:
        deepspeed = Sourced(
            env["DEEPSPEED_TIMEOUT"], env_var("DEEPSPEED_TIMEOUT", "(set by you, kept)")
        )
    else:  # DeepSpeed reads it in minutes (deepspeed/constants.py default_pg_timeout)
        out["DEEPSPEED_TIMEOUT"] = str(-(-seconds // 60))
        deepspeed = Sourced(
            out["DEEPSPEED_TIMEOUT"],
            derived(f"{PREFIX}COLLECTIVE_TIMEOUT in minutes (DeepSpeed's own: 10)"),
        )
    warnings: tuple[str, ...] = ()
    if launcher is Launcher.ACCELERATE:
        warnings = (
            "accelerate's process-group timeout is 1800 s on gloo (600 s on NCCL) "
            "unless the trainer passes InitProcessGroupKwargs(timeout=...): read "
            "ENTRYPOINT_COLLECTIVE_TIMEOUT from the environment there",
        )
    return Timeouts(out, collective, deepspeed, warnings)
