"""The steps of `make_plan` (entrypoint.plan.node_plan), in its order: up to the layout (the seat,
the master, the GPUs' workers, the trainer and its launcher, this process's place), then from it
on (the config and its batch split, the trainer's variables, the launcher's command, node 0's
control port). Each is a pure function of the settings, the platform's reading and
the facts that returns what it decided with its source (`Sourced`); `make_plan` alone puts them
into the plan."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from entrypoint.plan import configs, launch_lines, launchers, platforms, ports
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.facts import Facts
from entrypoint.plan.launch_lines import LOCAL_RANK_ARG, LOCAL_RANK_FIRST, Adopted
from entrypoint.plan.launchers import Launcher, LaunchSpec, Layout
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
    """Explicit settings beat the platform's values.

    Args:
        reading: the platform's reading.
        settings: the ENTRYPOINT_* settings (`nnodes`, `node_rank`, `master_addr`, `master_port`).

    Returns:
        The reading with each setting given in place of the platform's value.

    Raises:
        ConfigError: ENTRYPOINT_MASTER_ADDR is not one host.
    """
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
    """The platform this node runs on and its reading.

    Args:
        env: the node's environment.
        settings: the ENTRYPOINT_* settings (read from `env` when None).

    Returns:
        (platform name, why it was chosen, its reading with explicit settings applied).

    Raises:
        ConfigError: the platform's variables, or ENTRYPOINT_PLATFORM, are refused.
    """
    module, why = platforms.detect(env)
    return module.NAME, why, overlay(module.read(env), settings or Settings.from_env(env))


@dataclass(frozen=True)
class Seat:
    """What `seated` decided: the seat this node trains in, and where the platform started it."""

    reading: Reading  # the platform's, with the node count and rank this node trains with
    nnodes: Sourced[int]  # the nodes the job trains on
    node_rank: Sourced[int]  # this node's seat; the platform's source when seating kept it
    standby: bool  # a spare: planned as the last seat, starts no trainer until seated
    members: int  # the nodes the platform started
    member: int  # this node's index among them


def seated(reading: Reading, settings: Settings, seat: tuple[int, int] | None) -> Seat:
    """The node count and rank this node trains with, and whether it stands by.
    ENTRYPOINT_SPARES=S: the platform's N+S nodes train on N, the last S stand by (planned as
    the last seat, never launched so).

    Args:
        reading: the platform's reading, explicit settings applied.
        settings: the ENTRYPOINT_* settings (`spares`, `min_nodes`).
        seat: (node rank, nnodes) when node 0 seated this node after a loss
            (entrypoint.coordinator.roster); None otherwise.

    Returns:
        The seat, with the reading that holds it.

    Raises:
        ConfigError: the node rank is not below the node count; spares or a minimum where the
            platform started every worker, or that leave no node to train.
    """
    below(
        reading.node_rank.source.names("node_rank"),
        reading.node_rank.value,
        reading.nnodes.source.names("nnodes"),
        reading.nnodes.value,
    )
    spares, least = settings.spares, settings.min_nodes
    members, member = reading.nnodes.value, reading.node_rank.value
    if not spares and least is None and seat is None:
        return Seat(reading, reading.nnodes, reading.node_rank, False, members, member)
    _refuse_spares(reading, spares, least)
    full = members - spares
    counted = reading.nnodes.source.names("nnodes")
    if seat is not None:
        rank, nnodes = seat
        why = derived(f"seated by node 0 after a lost node (node {member} of {members})")
    else:
        nnodes, rank = full, min(member, full - 1)
        why = derived(f"{counted}={members} less {PREFIX}SPARES={spares}", counted)
    moved = rank != member or seat is not None
    standby = seat is None and member >= full
    trains = replace(reading, nnodes=Sourced(nnodes, why), node_rank=Sourced(rank, why))
    kept = trains.node_rank if moved else reading.node_rank
    return Seat(trains, trains.nnodes, kept, standby, members, member)


def _refuse_spares(reading: Reading, spares: int, least: int | None) -> None:
    """Spares and a minimum need one entrypoint per node, and a node left to train."""
    members = reading.nnodes.value
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


def gpus_stated(settings: Settings, reading: Reading) -> bool:
    """Whether the plan can be made without probing GPUs."""
    return (
        settings.gpus_per_node is not None
        or reading.gpus_per_node is not None
        or settings.device == "cpu"
    )


def master(reading: Reading, nnodes: int) -> Sourced[str]:
    """Node 0's address: the platform's (or ENTRYPOINT_MASTER_ADDR), else loopback on one node.

    Args:
        reading: the platform's reading, seated.
        nnodes: the nodes the job trains on.

    Returns:
        The address and its source.

    Raises:
        ConfigError: no address on more than one node.
    """
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
    return master


def adopt(adopted: Adopted, reading: Reading, spawn: bool) -> list[str]:
    """Notes on the user's launch line (launch_lines): its node count checked against the
    platform's (a disagreement is refused), what the entrypoint supplies in place of it.

    Args:
        adopted: the user's launch line, read.
        reading: the platform's reading, seated.
        spawn: whether the entrypoint starts the workers.

    Returns:
        The notes for the plan.

    Raises:
        ConfigError: the platform started every worker already, or the line's node count
            disagrees with the platform's.
    """
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
    if adopted.trainer[: len(LOCAL_RANK_FIRST)] == LOCAL_RANK_FIRST:
        notes.append(
            "the script gets --local-rank=N before its arguments, as torch.distributed.launch "
            "gives it (--use-env: not)"
        )
    elif adopted.kind == "deepspeed" and adopted.trainer[: len(LOCAL_RANK_ARG)] == LOCAL_RANK_ARG:
        notes.append(
            "the script gets --local_rank=N after its arguments, as DeepSpeed's launcher "
            "gives it (--no_local_rank: not)"
        )
    notes += [said] if said else []
    return notes + ([_replaced(adopted)] if adopted.replaced else [])


def _replaced(adopted: Adopted) -> str:
    """The note on what the line said that the entrypoint decides instead."""
    given = ", ".join(
        (f"--{k} {v}" if " in " not in k else f"{k}: {v}").rstrip()
        for k, v in adopted.replaced.items()
    )
    return (
        f"from your launch line, {given}: replaced by the entrypoint's own (node count, "
        "node rank, master and rendezvous from the platform"
        + ("; logs, restarts and signals its torchrun's)" if adopted.kind != "accelerate" else ")")
    )


def adopted_launcher(settings: Settings) -> Sourced[Launcher]:
    """accelerate's launcher, which a user's `accelerate launch` line asks for.

    Args:
        settings: the ENTRYPOINT_* settings (`launcher`).

    Returns:
        accelerate, and its source.

    Raises:
        ConfigError: ENTRYPOINT_LAUNCHER names another launcher.
    """
    if settings.launcher not in ("auto", Launcher.ACCELERATE.value):
        raise ConfigError(
            f"{PREFIX}LAUNCHER",
            settings.launcher,
            "disagrees with your accelerate launch line",
            f"Unset {PREFIX}LAUNCHER: the line says accelerate",
        )
    return Sourced(Launcher.ACCELERATE, derived("your accelerate launch line"))


def nproc(
    settings: Settings,
    reading: Reading,
    launcher: Launcher,
    device: str,
    gpus: Sourced[int],
    adopted: Adopted | None = None,
) -> Sourced[int]:
    """Workers per node: one for JAX, else ENTRYPOINT_NPROC_PER_NODE, the user's launch line,
    the platform's, one per GPU, or 1 on CPU.

    Args:
        settings: the ENTRYPOINT_* settings (`nproc_per_node`).
        reading: the platform's reading, seated.
        launcher: the launcher chosen.
        device: cuda or cpu.
        gpus: the GPUs per node and their source.
        adopted: the user's launch line, if the command is one.

    Returns:
        The workers per node and their source.

    Raises:
        ConfigError: a count for JAX, counts that disagree, or more GPU workers than GPUs.
    """
    if launcher is Launcher.JAX and reading.spawn.value:
        if settings.nproc_per_node not in (None, 1):
            raise ConfigError(
                f"{PREFIX}NPROC_PER_NODE",
                settings.nproc_per_node,
                "JAX runs one process per node that owns all its GPUs",
                f"Unset {PREFIX}NPROC_PER_NODE for the jax launcher, or unset {PREFIX}LAUNCHER "
                "for several JAX processes a node: torchrun starts them, each with its own GPU",
            )
        return Sourced(1, derived("jax: one process per node owns all the node's devices"))
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
        count = Sourced(gpus.value, derived(f"one worker per GPU ({gpus.source})"))
    else:
        count = Sourced(1, by_default("default 1 on CPU"))
    if device == "cuda" and count.value > gpus.value:
        raise ConfigError(
            count.source.names(f"{PREFIX}NPROC_PER_NODE"),
            count.value,
            f"asks for {count.value} GPU workers but this node has {gpus.value} GPUs "
            f"({gpus.source})",
            f"Ask for at most {gpus.value} workers per node, or run on nodes with more GPUs",
        )
    return count


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
    command: Sequence[str] | None, settings: Settings, adopted: Adopted | None = None
) -> Sourced[tuple[str, ...]]:
    """The trainer's command: the command line's, else the image's built-in job.

    Args:
        command: the command after `--` (the script alone, for a user's launch line).
        settings: the ENTRYPOINT_* settings (`job`).
        adopted: the user's launch line, if the command was one.

    Returns:
        The command and its source.

    Raises:
        ConfigError: the command's program is an empty word.
    """
    if command and not command[0].strip():
        raise ConfigError(
            "command",
            command[0],
            "the trainer's program is an empty word",
            "Give the trainer command after --, e.g. -- python train.py",
        )
    if command:
        why = derived(
            f"your {adopted.line} line's script, run by the entrypoint's "
            + ("torchrun" if adopted.kind != "accelerate" else "accelerate launch")
            if adopted
            else "command line after --"
        )
        return Sourced(tuple(command), why)
    why = derived(f"the image's built-in {settings.job} job ({PREFIX}JOB)")
    return Sourced(BUILTIN_JOBS[settings.job], why)


def placed(reading: Reading) -> tuple[Sourced[int], Sourced[int]] | None:
    """Where the platform placed this process, when it started every worker itself.

    Args:
        reading: the platform's reading, seated.

    Returns:
        (rank, local_rank) with their sources; None when the entrypoint spawns the workers.
    """
    if reading.spawn.value:
        return None
    if reading.rank is None or reading.local_rank is None:
        raise AssertionError(f"{reading.platform}: spawn is False but no rank was read")
    return reading.rank, reading.local_rank


def inside(placed: tuple[Sourced[int], Sourced[int]], nnodes: int, nproc: int) -> None:
    """A process the platform started must lie inside the job as planned: ENTRYPOINT_NNODES or
    ENTRYPOINT_NPROC_PER_NODE may not shrink the job around it.

    Args:
        placed: (rank, local_rank) of this process, with their sources.
        nnodes: the nodes the job trains on.
        nproc: the workers per node.

    Raises:
        ConfigError: the rank or local rank lies outside the job.
    """
    for (value, size, what), key in zip(
        (
            (placed[0], nnodes * nproc, "the world size"),
            (placed[1], nproc, "the processes per node"),
        ),
        ("rank", "local_rank"),
        strict=True,
    ):
        if value.value >= size:
            raise ConfigError(
                value.source.names(key.upper()),
                value.value,
                f"is outside the job as planned: {what} is {size} ({nnodes} nodes "
                f"x {nproc} per node)",
                f"Leave {PREFIX}NNODES and {PREFIX}NPROC_PER_NODE unset when the "
                "platform started every process, or make them match it",
            )


@dataclass(frozen=True)
class NodeWorkers:
    """What the steps before `layout` decided about this node's workers."""

    master: str  # node 0's address
    nproc: int  # workers per node
    gpus_per_node: int
    cuda_visible: str | None  # the workers' CUDA_VISIBLE_DEVICES; None on CPU
    python: str  # the interpreter that runs them
    placed: tuple[int, int] | None  # (rank, local_rank) when the platform started this process
    member: int  # this node's index among the nodes the platform started


def layout(
    env: Mapping[str, str], settings: Settings, reading: Reading, *, workers: NodeWorkers
) -> Layout:
    """Where this node stands, decided: what every launcher's builder reads.

    Args:
        env: the node's environment (a MASTER_PORT there makes one node rendezvous on it).
        settings: the ENTRYPOINT_* settings (`master_port`, `run_dir`).
        reading: the platform's reading, seated.
        workers: what the steps before decided about this node's workers.

    Returns:
        The layout.
    """
    nnodes, node_rank, spawn = reading.nnodes.value, reading.node_rank.value, reading.spawn.value
    placed = workers.placed
    return Layout(
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=workers.nproc,
        master_addr=workers.master,
        master_port=reading.master_port.value,
        standalone=nnodes == 1 and settings.master_port is None and "MASTER_PORT" not in env,
        spawn=spawn,
        rank=placed[0] if placed else None,
        local_rank=placed[1] if placed else None,
        gpus_per_node=workers.gpus_per_node,
        cuda_visible=workers.cuda_visible,
        python=workers.python,
        run_dir=f"{settings.run_dir}/node{workers.member}",
    )  # nodes sharing a host keep apart (by the platform's index: a seat changes hands)


# -- from the layout on: the config, the trainer's variables, the launch, node 0's ports ------


@dataclass(frozen=True)
class ConfigChoice:
    """What `config` decided: the config, its DeepSpeed config for this world size, and what
    the plan gains from them."""

    config: Sourced[configs.Config]
    deepspeed: dict | None  # None: the config does not fit, and the trainer does not use it
    batch: Sourced[int] | None  # train_batch_size, as split for this world size
    env: Mapping[str, str]
    files: Mapping[str, str]
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def config(
    settings: Settings, device: str, devices: int, needs_config: bool, run_dir: str
) -> ConfigChoice:
    """The named config, else the one for the nearest world size, and its deepspeed.json
    with the batch split for this world size.

    Args:
        settings: the ENTRYPOINT_* settings (`config`).
        device: cuda or cpu.
        devices: the workers in the job (GPUs in total for JAX).
        needs_config: whether the trainer uses the config (a misfit is then refused).
        run_dir: this node's run directory, where deepspeed.json goes.

    Returns:
        The config, its DeepSpeed config, and the variables, files, notes and warnings.

    Raises:
        ConfigError: the named config is unknown or unreadable, or does not fit the world
            size where the trainer uses it.
    """
    chosen, why = configs.select(settings.config, device=device, world_size=devices)
    try:
        split = configs.split(chosen, devices)
    except ConfigError as err:
        if needs_config:
            raise
        note = f"config {chosen.name} does not fit; your trainer does not use it: {err.line()}"
        return ConfigChoice(Sourced(chosen, why), None, None, {}, {}, notes=(note,))
    ds_path = f"{run_dir}/deepspeed.json"
    deepspeed = configs.derive_deepspeed(chosen, devices)
    files = {ds_path: json.dumps(deepspeed, indent=2) + "\n"}
    env = {"ENTRYPOINT_CONFIG_DIR": str(chosen.path), "ENTRYPOINT_DEEPSPEED_CONFIG": ds_path}
    batch = None
    told: tuple[str, ...] = ()
    if split is not None:
        batch = Sourced(split.global_batch, derived(split.why))
        if split.global_batch != split.asked:
            told = (split.why,)
    return ConfigChoice(
        Sourced(chosen, why),
        deepspeed,
        batch,
        env,
        files,
        notes=() if needs_config else told,
        warnings=told if needs_config else (),
    )


def device_env(
    env: Mapping[str, str], settings: Settings, facts: Facts, device: str, nproc: int
) -> dict[str, str]:
    """The variables the device asks for: CPU workers' (unless set), JAX's memory settings.

    Args:
        env: the node's environment (a variable set there is kept).
        settings: the ENTRYPOINT_* settings (`xla_preallocate`, `xla_mem_fraction`).
        facts: this node's facts (its CPU count).
        device: cuda or cpu.
        nproc: the workers per node (they share the CPUs).

    Returns:
        The variables to set.
    """
    out: dict[str, str] = {}
    if device == "cpu":
        for key, value in (
            ("DS_ACCELERATOR", "cpu"),
            ("JAX_PLATFORMS", "cpu"),
            ("OMP_NUM_THREADS", str(max(1, facts.cpu_count // nproc))),
        ):
            if key not in env:
                out[key] = value
    for key, setting in (
        ("XLA_PYTHON_CLIENT_PREALLOCATE", settings.xla_preallocate),
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", settings.xla_mem_fraction),
    ):
        if setting is not None:
            out[key] = str(setting).lower() if isinstance(setting, bool) else str(setting)
    return out


def site_hook(env: Mapping[str, str]) -> Sourced[str]:
    """The trainer's interpreter starts with entrypoint/trainer_side/site-hook first on its path.

    Args:
        env: the node's environment (its PYTHONPATH follows the hook).

    Returns:
        The trainer's PYTHONPATH and its source.
    """
    path = os.pathsep.join(p for p in (str(jax_cluster.SITE_HOOK), env.get("PYTHONPATH")) if p)
    return Sourced(
        path,
        derived(
            "the entrypoint's site hook first: jax.distributed.initialize() with no arguments "
            "reads the plan (entrypoint/trainer_side/jax_cluster.py); accelerate on CPU nodes "
            "gets gloo (entrypoint/trainer_side/accelerate_cpu.py); every rank's steps reported "
            "to this node (entrypoint/trainer_side/step_hook.py)"
        ),
    )


@dataclass(frozen=True)
class Launched:
    """What `launch` decided: the launcher's command and what it needs, the timeouts."""

    spec: LaunchSpec
    preflight: Sourced[tuple[str, ...]] | None  # the trainer behind the all-reduce measurement
    timeouts: launchers.Timeouts


def launch(
    env: Mapping[str, str],
    settings: Settings,
    trainer: tuple[str, ...],
    launcher: Launcher,
    layout: Layout,
    config: configs.Config,
    deepspeed: dict | None,
    adopted: Adopted | None = None,
) -> Launched:
    """The launcher's command, variables and files for this node, and the collective timeouts.

    Args:
        env: the node's environment.
        settings: the ENTRYPOINT_* settings.
        trainer: the trainer's command.
        launcher: the launcher chosen.
        layout: where this node stands.
        config: the config chosen, and `deepspeed` its DeepSpeed config (None: unused).
        adopted: the user's launch line, if the command was one.

    Returns:
        The launch, the preflight's trainer if any, the timeouts.

    Raises:
        ConfigError: ENTRYPOINT_PREFLIGHT_ALLREDUCE with a launcher that starts no torchrun.
    """
    preflight = launchers.preflight(trainer, settings, launcher)
    launched = preflight.value if preflight else trainer
    spec = launchers.build(launcher, layout, launched, config, deepspeed, adopted)
    return Launched(spec, preflight, launchers.timeouts(env, settings, launcher))


def choose_control_port(
    settings: Settings, reading: Reading, layout: Layout
) -> Sourced[int | None]:
    """Never the rendezvous port, never past 65535 (entrypoint.plan.settings.control_port).

    Args:
        settings: the ENTRYPOINT_* settings (`control_port`).
        reading: the platform's reading (the rendezvous port's source).
        layout: where this node stands (the rendezvous port, standalone or not).

    Returns:
        Node 0's control port (None: any free port) and its source.

    Raises:
        ConfigError: ENTRYPOINT_CONTROL_PORT is the rendezvous port.
    """
    return control_port(settings, layout.master_port, reading.master_port.source, layout.standalone)


def control_port(
    settings: Settings, master_port: int | None, master_source: Source, standalone: bool
) -> Sourced[int | None]:
    """ENTRYPOINT_CONTROL_PORT, else the rendezvous port + 1 (- 1 when that is 65535), never
    the rendezvous port itself.

    Args:
        settings: the ENTRYPOINT_* settings (`control_port`).
        master_port: the rendezvous port, and `master_source` where it came from.
        standalone: one node, no port stated: torchrun picks a free one.

    Returns:
        Node 0's control port (None: any free port) and its source.

    Raises:
        ConfigError: ENTRYPOINT_CONTROL_PORT is the rendezvous port.
    """
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
        return Sourced(stated, env_var(f"{PREFIX}CONTROL_PORT"))
    if master_port is None or standalone:
        return Sourced(None, derived("single node: any free port on loopback"))
    if ports.control_after(master_port) > master_port:
        return Sourced(master_port + 1, derived(f"master port + 1 ({PREFIX}CONTROL_PORT unset)"))
    return Sourced(
        master_port - 1,
        derived(f"master port - 1, as 65535 is the last port ({PREFIX}CONTROL_PORT unset)"),
    )
