"""The steps of `make_plan` (entrypoint.plan.plan), each a pure function of the settings, the
platform's reading and the facts. Each records in `sources` what decided its values; `Out`
collects what the steps add to the plan as they go (variables, files, notes, warnings)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from entrypoint.plan import configs, launch_lines, launchers, platforms, ports
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.facts import Facts
from entrypoint.plan.launch_lines import LOCAL_RANK_ARG, Adopted
from entrypoint.plan.launchers import Launcher, Layout
from entrypoint.plan.platforms.base import Reading
from entrypoint.plan.settings import PREFIX, Settings
from entrypoint.plan.values import Source, Sourced, below, by_default, derived, env_var, host
from entrypoint.trainer_side import jax_cluster

# The image's built-in jobs (entrypoint/job), run when no trainer command is given.
BUILTIN_JOBS = {
    "deepspeed": ("python", "-m", "entrypoint.job"),
    "jax": ("python", "-m", "entrypoint.job.jax_train"),
}
BUILTIN_JOB = BUILTIN_JOBS["deepspeed"]


def overlay(reading: Reading, settings: Settings) -> Reading:
    """Explicit settings beat the platform's values."""
    changes: dict = {}
    for name in ("nnodes", "node_rank", "master_addr", "master_port"):
        value = getattr(settings, name)
        if value is not None:
            variable = f"{PREFIX}{name.upper()}"
            if name == "master_addr":  # the plan holds the bare form: fd00::2, not [fd00::2]
                value = host(variable, value)
            changes[name] = Sourced(value, env_var(variable))
    return replace(reading, **changes) if changes else reading


def read_platform(
    env: Mapping[str, str], settings: Settings | None = None
) -> tuple[str, str, Reading]:
    """(platform name, why it was chosen, its reading with explicit settings applied)."""
    module, why = platforms.detect(env)
    return module.NAME, why, overlay(module.read(env), settings or Settings.from_env(env))


def seated(
    reading: Reading, settings: Settings, seat: tuple[int, int] | None, sources: dict[str, Source]
) -> tuple[Reading, bool]:
    """(the reading with the node count and rank this node trains with, whether it stands by).
    ENTRYPOINT_SPARES=S: the platform's N+S nodes train on N, the last S stand by (planned as
    the last seat, never launched so). `seat` (node rank, nnodes): node 0 seated this node
    after a loss (entrypoint.control.roster)."""
    below(
        reading.node_rank.source.names("node_rank"),
        reading.node_rank.value,
        reading.nnodes.source.names("nnodes"),
        reading.nnodes.value,
    )
    spares, least = settings.spares, settings.min_nodes
    if not spares and least is None and seat is None:
        return reading, False
    members, member = reading.nnodes.value, reading.node_rank.value
    named = f"{PREFIX}SPARES" if spares else f"{PREFIX}MIN_NODES"
    if not reading.spawn.value:
        raise ConfigError(
            named,
            spares or least,
            f"needs one entrypoint per node, but {reading.platform} started one process per "
            "worker here",
            "Start one task per node (SLURM: --ntasks-per-node=1), or unset it",
        )
    full = members - spares
    counted = reading.nnodes.source.names("nnodes")
    if full < 1:
        raise ConfigError(
            named,
            spares,
            f"leaves no node to train: {counted}={members} nodes were started in all",
            f"Start the nodes to train plus {spares} (the platform's count includes the "
            f"spares), or lower {PREFIX}SPARES below {members}",
        )
    if least is not None and least > full:
        raise ConfigError(
            f"{PREFIX}MIN_NODES",
            least,
            f"is more than the {full} nodes the job trains on ({counted}={members} less "
            f"{PREFIX}SPARES={spares})",
            f"Set it to {full} or less",
        )
    if seat is not None:
        rank, nnodes = seat
        why = derived(f"seated by node 0 after a lost node (node {member} of {members})")
    else:
        nnodes, rank = full, min(member, full - 1)
        why = derived(f"{counted}={members} less {PREFIX}SPARES={spares}", counted)
    sources["nnodes"] = why
    if rank != member or seat is not None:
        sources["node_rank"] = why
    standby = seat is None and member >= full
    return replace(reading, nnodes=Sourced(nnodes, why), node_rank=Sourced(rank, why)), standby


def gpus_stated(settings: Settings, reading: Reading) -> bool:
    """Whether the plan can be made without probing GPUs."""
    return (
        settings.gpus_per_node is not None
        or reading.gpus_per_node is not None
        or settings.device == "cpu"
    )


def master(reading: Reading, nnodes: int, sources: dict[str, Source]) -> str:
    master = reading.master_addr
    if master is None:
        if nnodes > 1:
            raise ConfigError(
                "MASTER_ADDR",
                None,
                f"{nnodes} nodes but no master address",
                "Set MASTER_ADDR (or ENTRYPOINT_MASTER_ADDR) on every node to "
                "node 0's host name or IP",
            )
        master = Sourced("127.0.0.1", by_default("default: single node, loopback"))
    sources["master_addr"] = master.source
    return master.value


def adopt(adopted: Adopted, reading: Reading, spawn: bool) -> list[str]:
    """Notes on the user's launch line (launch_lines): its node count checked against the
    platform's (a disagreement is refused), what the entrypoint supplies in place of it."""
    if not spawn:
        raise ConfigError(
            "command",
            adopted.line,
            "the platform already started one process per GPU: a launcher would start more",
            "Give the script alone after --, e.g. entrypoint run -- python train.py",
        )
    nnodes = reading.nnodes
    said = launch_lines.check_nodes(adopted, nnodes.value, str(nnodes.source))
    if adopted.kind == "accelerate":
        notes = [
            f"your {adopted.line} line is run by the entrypoint on every node, with "
            + (
                f"the settings of {adopted.config_file} "
                if adopted.config_file
                else "accelerate's defaults "
            )
            + "and this cluster's numbers (machines, machine rank, main process, processes)"
        ]
        if adopted.num_processes is not None:
            notes.append(
                f"{adopted.nproc_name}: {adopted.num_processes} agrees with the platform's "
                f"{nnodes.value} nodes; the entrypoint's count is used"
            )
    else:
        notes = [f"your {adopted.line} line is run by the entrypoint's torchrun, on every node"]
    if adopted.kind == "deepspeed" and adopted.trainer[: len(LOCAL_RANK_ARG)] == LOCAL_RANK_ARG:
        notes.append(
            "the script gets --local_rank=N after its arguments, as DeepSpeed's launcher "
            "gives it (--no_local_rank: not)"
        )
    notes += [said] if said else []
    if adopted.replaced:
        given = ", ".join(
            (f"--{k} {v}" if " in " not in k else f"{k}: {v}").rstrip()
            for k, v in adopted.replaced.items()
        )
        notes.append(
            f"from your launch line, {given}: replaced by the entrypoint's own (node count, "
            "node rank, master and rendezvous from the platform"
            + (
                "; logs, restarts and signals its torchrun's)"
                if adopted.kind != "accelerate"
                else ")"
            )
        )
    return notes


def adopted_launcher(settings: Settings, sources: dict[str, Source]) -> Launcher:
    """accelerate's launcher, which a user's `accelerate launch` line asks for."""
    if settings.launcher not in ("auto", Launcher.ACCELERATE.value):
        raise ConfigError(
            f"{PREFIX}LAUNCHER",
            settings.launcher,
            "disagrees with your accelerate launch line",
            f"Unset {PREFIX}LAUNCHER: the line says accelerate",
        )
    sources["launcher"] = derived("your accelerate launch line")
    return Launcher.ACCELERATE


def nproc(
    settings: Settings,
    reading: Reading,
    launcher: Launcher,
    device: str,
    gpus: int,
    sources: dict[str, Source],
    adopted: Adopted | None = None,
) -> int:
    if launcher is Launcher.JAX and reading.spawn.value:
        if settings.nproc_per_node not in (None, 1):
            raise ConfigError(
                f"{PREFIX}NPROC_PER_NODE",
                settings.nproc_per_node,
                "JAX runs one process per node that owns all its GPUs",
                f"Unset {PREFIX}NPROC_PER_NODE for the jax launcher",
            )
        sources["nproc_per_node"] = derived("jax: one process per node owns all the node's devices")
        return 1
    stated = adopted.nproc_per_node if adopted else None
    if stated is not None:
        assert adopted is not None
        _agrees(adopted, stated, settings, reading)
    if settings.nproc_per_node is not None:
        count = Sourced(settings.nproc_per_node, env_var(f"{PREFIX}NPROC_PER_NODE"))
    elif stated is not None:
        assert adopted is not None
        count = Sourced(stated, derived(f"your {adopted.line} line's {adopted.nproc_name}"))
    elif reading.nproc_per_node is not None:
        count = reading.nproc_per_node
    elif device == "cuda":
        count = Sourced(gpus, derived(f"one worker per GPU ({sources['gpus_per_node']})"))
    else:
        count = Sourced(1, by_default("default 1 on CPU"))
    if device == "cuda" and count.value > gpus:
        raise ConfigError(
            count.source.names(f"{PREFIX}NPROC_PER_NODE"),
            count.value,
            f"asks for {count.value} GPU workers but this node has {gpus} GPUs "
            f"({sources['gpus_per_node']})",
            f"Ask for at most {gpus} workers per node, or run on nodes with more GPUs",
        )
    sources["nproc_per_node"] = count.source
    return count.value


def _agrees(adopted: Adopted, stated: int, settings: Settings, reading: Reading) -> None:
    """The line's workers per node against ENTRYPOINT_NPROC_PER_NODE and the platform's."""
    for other in (
        Sourced(settings.nproc_per_node, env_var(f"{PREFIX}NPROC_PER_NODE"))
        if settings.nproc_per_node is not None
        else None,
        reading.nproc_per_node,
    ):
        if other is not None and other.value != stated:
            per_node = (
                f"{adopted.num_processes} processes on {reading.nnodes.value} nodes, "
                f"{stated} a node, "
                if adopted.kind == "accelerate"
                else ""
            )
            raise ConfigError(
                adopted.nproc_name,
                adopted.num_processes if adopted.kind == "accelerate" else stated,
                f"in your {adopted.line} line ({per_node}but {other.source} says "
                f"{other.value} a node)"
                if per_node
                else f"in your {adopted.line} line, but {other.source} says {other.value}",
                "Make them agree, or drop one of them",
            )


def trainer(
    command: Sequence[str] | None,
    settings: Settings,
    sources: dict[str, Source],
    adopted: Adopted | None = None,
) -> tuple[str, ...]:
    if command and not command[0].strip():
        raise ConfigError(
            "command",
            command[0],
            "the trainer's program is an empty word",
            "Give the trainer command after --, e.g. -- python train.py",
        )
    if command:
        sources["trainer"] = derived(
            f"your {adopted.line} line's script, run by the entrypoint's "
            + ("torchrun" if adopted.kind != "accelerate" else "accelerate launch")
            if adopted
            else "command line after --"
        )
        return tuple(command)
    sources["trainer"] = derived(f"the image's built-in {settings.job} job ({PREFIX}JOB)")
    return BUILTIN_JOBS[settings.job]


@dataclass
class Out:
    """What the steps below add to the plan as they go."""

    env: dict[str, str | None] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def config(
    settings: Settings, device: str, devices: int, needs_config: bool, run_dir: str, out: Out
) -> tuple[configs.Config, dict | None]:
    """The named config, else the one for the nearest world size, and its deepspeed.json
    with the batch split for this world size (`devices`: GPUs in total for JAX)."""
    config, out.sources["config"] = configs.select(
        settings.config, device=device, world_size=devices
    )
    try:
        split = configs.split(config, devices)
    except ConfigError as err:
        if needs_config:
            raise
        out.notes.append(
            f"config {config.name} does not fit; your trainer does not use it: {err.line()}"
        )
        return config, None
    ds_path = f"{run_dir}/deepspeed.json"
    deepspeed = configs.derive_deepspeed(config, devices)
    out.files[ds_path] = json.dumps(deepspeed, indent=2) + "\n"
    out.env |= {"ENTRYPOINT_CONFIG_DIR": str(config.path), "ENTRYPOINT_DEEPSPEED_CONFIG": ds_path}
    if split is not None:
        out.sources["train_batch_size"] = derived(split.why)
        if split.global_batch != split.asked:
            (out.warnings if needs_config else out.notes).append(split.why)
    return config, deepspeed


def device_env(
    env: Mapping[str, str], settings: Settings, facts: Facts, device: str, nproc: int, out: Out
) -> None:
    if device == "cpu":
        for key, value in (
            ("DS_ACCELERATOR", "cpu"),
            ("JAX_PLATFORMS", "cpu"),
            ("OMP_NUM_THREADS", str(max(1, facts.cpu_count // nproc))),
        ):
            if key not in env:
                out.env[key] = value
    for key, setting in (
        ("XLA_PYTHON_CLIENT_PREALLOCATE", settings.xla_preallocate),
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", settings.xla_mem_fraction),
    ):
        if setting is not None:
            out.env[key] = str(setting).lower() if isinstance(setting, bool) else str(setting)


def site_hook(env: Mapping[str, str], out: Out) -> None:
    """The trainer's interpreter starts with entrypoint/trainer_side/site-hook first on its path."""
    out.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(jax_cluster.SITE_HOOK), env.get("PYTHONPATH")) if p
    )
    out.sources["PYTHONPATH"] = derived(
        "the entrypoint's site hook first: jax.distributed.initialize() with no arguments reads "
        "the plan (entrypoint/trainer_side/jax_cluster.py); accelerate on CPU nodes gets gloo "
        "(entrypoint/trainer_side/accelerate_cpu.py); every rank's steps reported to this node "
        "(entrypoint/trainer_side/progress.py)"
    )


def choose_control_port(
    settings: Settings, reading: Reading, layout: Layout, sources: dict[str, Source]
) -> int | None:
    """Never the rendezvous port, never past 65535 (entrypoint.plan.settings.control_port)."""
    port, sources["control_port"] = control_port(
        settings, layout.master_port, reading.master_port.source, layout.standalone
    )
    return port


def placed(reading: Reading, sources: dict[str, Source]) -> tuple[int, int] | None:
    """(rank, local_rank) of this process when the platform started it, else None."""
    if reading.spawn.value:
        return None
    if reading.rank is None or reading.local_rank is None:
        raise AssertionError(f"{reading.platform}: spawn is False but no rank was read")
    sources["rank"], sources["local_rank"] = reading.rank.source, reading.local_rank.source
    return reading.rank.value, reading.local_rank.value


def inside(placed: tuple[int, int], nnodes: int, nproc: int, sources: dict[str, Source]) -> None:
    """A process the platform started must lie inside the job as planned: ENTRYPOINT_NNODES or
    ENTRYPOINT_NPROC_PER_NODE may not shrink the job around it."""
    for (value, size, what), key in zip(
        (
            (placed[0], nnodes * nproc, "the world size"),
            (placed[1], nproc, "the processes per node"),
        ),
        ("rank", "local_rank"),
        strict=True,
    ):
        if value >= size:
            raise ConfigError(
                sources[key].names(key.upper()),
                value,
                f"is outside the job as planned: {what} is {size} ({nnodes} nodes "
                f"x {nproc} per node)",
                f"Leave {PREFIX}NNODES and {PREFIX}NPROC_PER_NODE unset when the "
                "platform started every process, or make them match it",
            )


def layout(
    env: Mapping[str, str],
    settings: Settings,
    reading: Reading,
    master: str,
    nproc: int,
    n_gpus: int,
    cuda_visible: str | None,
    python: str,
    placed: tuple[int, int] | None,
    member: int,
) -> Layout:
    nnodes, node_rank, spawn = reading.nnodes.value, reading.node_rank.value, reading.spawn.value
    return Layout(
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=nproc,
        master_addr=master,
        master_port=reading.master_port.value,
        standalone=nnodes == 1 and settings.master_port is None and "MASTER_PORT" not in env,
        spawn=spawn,
        rank=placed[0] if placed else None,
        local_rank=placed[1] if placed else None,
        gpus_per_node=n_gpus,
        cuda_visible=cuda_visible,
        python=python,
        run_dir=f"{settings.run_dir}/node{member}",
    )  # nodes sharing a host keep apart (by the platform's index: a seat changes hands)


def launch(
    env: Mapping[str, str],
    settings: Settings,
    trainer: tuple[str, ...],
    launcher: Launcher,
    layout: Layout,
    config: configs.Config,
    deepspeed: dict | None,
    out: Out,
    adopted: Adopted | None = None,
) -> launchers.Launch:
    launched = launchers.preflight(trainer, settings, launcher, out.sources)
    launch = launchers.build(launcher, layout, launched, config, deepspeed, adopted)
    timeouts, timeout_warnings = launchers.timeouts(env, settings, launcher, out.sources)
    out.env |= launch.env | timeouts
    out.files |= launch.files
    out.sources |= launch.sources
    out.warnings += timeout_warnings
    return launch


def control_port(
    settings: Settings, master_port: int | None, master_source: Source, standalone: bool
) -> tuple[int | None, Source]:
    """(node 0's control port, its source): ENTRYPOINT_CONTROL_PORT, else the rendezvous port
    + 1 (- 1 when that is 65535), never the rendezvous port itself; None: any free port."""
    stated = settings.control_port
    if stated is not None:
        if not standalone and stated == master_port:
            raise ConfigError(
                PREFIX + "CONTROL_PORT",
                stated,
                f"is the rendezvous port too ({master_source.names('MASTER_PORT')}="
                f"{master_port}); torchrun's store and the entrypoints' channel "
                "cannot share it",
                f"Pick another free port on node 0, or unset "
                f"{PREFIX}CONTROL_PORT (default: the rendezvous port + 1)",
            )
        return stated, env_var(f"{PREFIX}CONTROL_PORT")
    if master_port is None or standalone:
        return None, derived("single node: any free port on loopback")
    if ports.control_after(master_port) > master_port:
        return master_port + 1, derived(f"master port + 1 ({PREFIX}CONTROL_PORT unset)")
    return master_port - 1, derived(
        f"master port - 1, as 65535 is the last port ({PREFIX}CONTROL_PORT unset)"
    )
