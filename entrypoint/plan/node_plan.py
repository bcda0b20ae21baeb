"""The launch plan: a frozen value computed by pure code from (environment, hardware facts).
`make_plan` runs the steps in entrypoint.plan.plan_steps in order, each returning
what it decided; this module is their sequence, and alone puts what they return into the plan.

Precedence for every value: explicit ENTRYPOINT_* settings beat the platform's variables,
which beat probes, which beat defaults; `sources` records which one decided.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from entrypoint.plan import configs, gpus, launch_lines, launchers, network, ports, stray_variables
from entrypoint.plan import plan_steps as steps
from entrypoint.plan.facts import Facts
from entrypoint.plan.launchers import ALLREDUCE, Launcher, LaunchSpec, Layout
from entrypoint.plan.plan_steps import BUILTIN_JOB, BUILTIN_JOBS, gpus_stated, read_platform
from entrypoint.plan.platforms.base import Reading
from entrypoint.plan.settings import PREFIX, Settings
from entrypoint.plan.values import Source, Sourced, derived

__all__ = [
    "ALLREDUCE",
    "BUILTIN_JOB",
    "BUILTIN_JOBS",
    "Plan",
    "gpus_stated",
    "make_plan",
    "read_platform",
]


@dataclass(frozen=True)
class Plan:
    platform: str
    nnodes: int
    node_rank: int
    nproc_per_node: int
    world_size: int
    master_addr: str
    master_port: int | None
    control_port: int | None  # the entrypoints' own channel on node 0; None: any free port
    spawn: bool
    rank: int | None
    local_rank: int | None
    device: str
    gpus_per_node: int
    cuda_visible_devices: str | None
    config: str | None
    launcher: Launcher
    command: tuple[str, ...]
    trainer: tuple[str, ...]
    env: Mapping[str, str | None]
    files: Mapping[str, str]
    sources: Mapping[str, Source]  # str() of each is what `plan` and plan.json show
    ranks: tuple[int, int]  # first and last global rank on this node
    hosts: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    gpu_names: tuple[str, ...] = field(default=())
    # The GPUs this node's workers use, as CUDA_VISIBLE_DEVICES spells them (indices, GPU-/MIG-
    # UUIDs): what the heartbeat's figures read, never re-parsed from the string.
    devices: tuple[str, ...] = field(default=())
    # Spares and shrinking (entrypoint.coordinator.roster): the nodes the platform started and this
    # node's index among them; `nnodes`/`node_rank` are the seat it trains in (the same without
    # them).
    members: int = 1
    member: int = 0
    spares: int = 0
    min_nodes: int = 1
    standby: bool = False  # a spare: joins, beats, starts no trainer until node 0 seats it
    metrics_port: int | None = None  # node 0's /metrics (entrypoint.metrics.collector); None: off

    def __post_init__(self) -> None:
        for name in ("env", "files", "sources"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = (
                {k: str(v) if isinstance(v, Source) else v for k, v in value.items()}
                if isinstance(value, Mapping)
                else list(value)
                if isinstance(value, tuple)
                else value
            )
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)


@dataclass(frozen=True)
class _Workers:
    """What the first half of `make_plan` decided: where and how the workers run."""

    n_gpus: int
    device: str
    trainer: tuple[str, ...]
    launcher: Launcher
    nproc: int
    devices: tuple[str, ...]
    layout: Layout  # the master, this process's place when the platform started it
    adopted: launch_lines.Adopted | None  # the user's own launch line
    sources: Mapping[str, Source]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class _Environment:
    """What the second half decided: the config, the launch, what the trainer is given."""

    config: configs.Config
    launch: LaunchSpec
    env: Mapping[str, str | None]
    files: Mapping[str, str]
    sources: Mapping[str, Source]
    notes: tuple[str, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class _Node:
    """Where this node stands before the steps: the platform, its reading, the seat."""

    platform: str
    why: str  # why this platform
    reading: Reading  # as the platform read it, explicit settings applied
    unknown: tuple[str, ...]  # warnings: ENTRYPOINT_* variables that are no setting
    seat: steps.Seat


def make_plan(
    env: Mapping[str, str],
    facts: Facts,
    command: Sequence[str] | None = None,
    read: tuple[str, str, Reading] | None = None,
    settings: Settings | None = None,
    seat: tuple[int, int] | None = None,
    master: str | None = None,
) -> Plan:
    """The plan for this node: platform reading -> seat -> GPU layout -> launcher and workers
    -> config -> network -> the launcher's command -> node 0's ports.

    Args:
        env: the node's environment.
        facts: this node's probed facts (GPUs, interfaces, CPUs, Python, launch config).
        command: the trainer's command after `--` (a launch line is adopted); None: the
            built-in job.
        read: (platform name, why, reading) when the caller has read it (once per run).
        settings: the ENTRYPOINT_* settings when the caller has them (read once per run).
        seat: (node rank, nnodes) when node 0 seated this node anew.
        master: the host of a new node 0, elected through etcd after node 0 was lost: the
            trainer's rendezvous moves there.

    Returns:
        The frozen plan, with the source of each value in `sources`.

    Raises:
        ConfigError: a value is missing, malformed, out of bounds or contradicts another.
    """
    settings = settings or Settings.from_env(env)
    platform_name, why, reading = read or read_platform(env, settings)
    if master is not None:
        elected = derived(f"node 0's seat holder in etcd ({PREFIX}ETCD), after node 0 was lost")
        reading = replace(reading, master_addr=Sourced(master, elected))
    unknown = tuple(
        stray_variables.warnings(env, Settings.model_fields)
    )  # ENTRYPOINT_STRICT: refused
    node = _Node(platform_name, why, reading, unknown, steps.seated(reading, settings, seat))
    w = _workers(env, settings, node.seat.reading, facts, command, node.seat.member)
    e = _environment(env, settings, facts, w)
    return _plan(node, settings, facts, w, e)


def _plan(node: _Node, settings: Settings, facts: Facts, w: _Workers, e: _Environment) -> Plan:
    """Node 0's ports, then every step's values, sources, notes and warnings in one plan."""
    reading, seat = node.seat.reading, node.seat
    control = steps.choose_control_port(settings, reading, w.layout)
    metrics = ports.metrics_port(settings, e.launch.master_port, control.value)
    sources = {"platform": derived(node.why)}
    sources |= {k: getattr(node.reading, k).source for k in ("nnodes", "node_rank", "master_port")}
    sources |= {"nnodes": seat.nnodes.source, "node_rank": seat.node_rank.source}
    sources |= {**w.sources, **e.sources}
    sources |= {"control_port": control.source, "metrics_port": metrics.source}
    nnodes, node_rank = seat.nnodes.value, seat.node_rank.value
    return Plan(
        platform=node.platform,
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=w.nproc,
        world_size=w.layout.world_size,
        master_addr=w.layout.master_addr,
        master_port=e.launch.master_port,
        control_port=control.value,
        metrics_port=metrics.value,
        spawn=w.layout.spawn,
        rank=w.layout.rank,
        local_rank=w.layout.local_rank,
        device=w.device,
        gpus_per_node=w.n_gpus,
        cuda_visible_devices=w.layout.cuda_visible,
        devices=w.devices,
        config=str(e.config.path),
        launcher=w.launcher,
        command=e.launch.command,
        trainer=w.trainer,
        env=e.env,
        files=e.files,
        sources=sources,
        hosts=reading.hosts,
        notes=(*node.reading.notes, *w.notes, *e.notes),
        warnings=(*node.reading.warnings, *node.unknown, *e.warnings),
        gpu_names=tuple(g.name for g in facts.gpus or ()),
        members=seat.members,
        member=seat.member,
        spares=settings.spares,
        min_nodes=settings.min_nodes or seat.members - settings.spares,
        standby=seat.standby,
        ranks=(w.layout.rank, w.layout.rank)
        if w.layout.rank is not None
        else (node_rank * w.nproc, node_rank * w.nproc + w.nproc - 1),
    )


def _workers(
    env: Mapping[str, str],
    settings: Settings,
    reading: Reading,
    facts: Facts,
    command: Sequence[str] | None,
    member: int,
) -> _Workers:
    """GPUs, device, trainer, launcher, workers per node, this process's place, the layout."""
    nnodes, spawn = reading.nnodes.value, reading.spawn.value
    master = steps.master(reading, nnodes)
    gpu = gpus.count(env, settings, reading, facts)
    device = gpus.device(settings, gpu.per_node.value)
    adopted = launch_lines.read(command, facts.launch_config, nnodes)
    notes = steps.adopt(adopted, reading, spawn) if adopted is not None else []
    trainer = steps.trainer(adopted.trainer if adopted else command, settings, adopted)
    launcher = _launcher(settings, spawn, trainer.value, adopted)
    nproc = steps.nproc(settings, reading, launcher.value, device.value, gpu.per_node, adopted)
    n = nproc.value
    sources = {"master_addr": master.source, "gpus_per_node": gpu.per_node.source}
    sources |= {"device": device.source, "spawn": reading.spawn.source}
    sources |= {
        "trainer": trainer.source,
        "launcher": launcher.source,
        "nproc_per_node": nproc.source,
    }
    sources["world_size"] = derived(f"nnodes {nnodes} x nproc_per_node {n}")
    placed = steps.placed(reading)
    if placed:
        sources |= {"rank": placed[0].source, "local_rank": placed[1].source}
        steps.inside(placed, nnodes, n)
    chosen: tuple[str, ...] = ()
    if device.value == "cuda":
        every = launcher.value is Launcher.JAX or not spawn
        chosen = gpu.visible.value if every else gpu.visible.value[:n]
        sources["cuda_visible_devices"] = gpu.visible.source
    at = (placed[0].value, placed[1].value) if placed else None
    workers = steps.NodeWorkers(
        master=master.value,
        nproc=n,
        gpus_per_node=gpu.per_node.value,
        cuda_visible=",".join(chosen) if device.value == "cuda" else None,
        python=facts.python,
        placed=at,
        member=member,
    )
    layout = steps.layout(env, settings, reading, workers=workers)
    return _Workers(
        n_gpus=gpu.per_node.value,
        device=device.value,
        trainer=trainer.value,
        launcher=launcher.value,
        nproc=n,
        devices=chosen,
        layout=layout,
        adopted=adopted,
        sources=sources,
        notes=tuple(notes),
    )


def _launcher(
    settings: Settings, spawn: bool, trainer: tuple[str, ...], adopted: launch_lines.Adopted | None
) -> Sourced[Launcher]:
    """accelerate for the user's accelerate launch line, else as `launchers.choose` decides."""
    if adopted is not None and adopted.kind == "accelerate":
        return steps.adopted_launcher(settings)
    return launchers.choose(settings, spawn, trainer == BUILTIN_JOBS["jax"])


def _environment(
    env: Mapping[str, str], settings: Settings, facts: Facts, w: _Workers
) -> _Environment:
    """The config and its batch split, the network, the trainer's variables, the launch."""
    nnodes = w.layout.nnodes
    cuda = w.device == "cuda"
    devices = nnodes * (w.n_gpus if w.launcher is Launcher.JAX and cuda else w.nproc)
    needs_config = w.trainer in BUILTIN_JOBS.values() or (
        w.launcher is Launcher.ACCELERATE and w.adopted is None  # a user's file has its own
    )
    chosen = steps.config(settings, w.device, devices, needs_config, w.layout.run_dir)
    net_env, net_sources, net_warnings = network.settle(
        env, facts, settings, nnodes=nnodes, device=w.device
    )
    out: dict[str, str | None] = {**chosen.env, **net_env, "MASTER_ADDR": w.layout.master_addr}
    if w.layout.cuda_visible is not None:
        out["CUDA_VISIBLE_DEVICES"] = w.layout.cuda_visible
    out |= steps.device_env(env, settings, facts, w.device, w.nproc)
    hook = steps.site_hook(env)
    out["PYTHONPATH"] = hook.value
    launched = steps.launch(
        env,
        settings,
        w.trainer,
        w.launcher,
        w.layout,
        chosen.config.value,
        chosen.deepspeed,
        w.adopted,
    )
    spec, timeouts = launched.spec, launched.timeouts
    out |= {**spec.env, **timeouts.env}
    sources = {"config": chosen.config.source}
    if chosen.batch is not None:
        sources["train_batch_size"] = chosen.batch.source
    sources |= net_sources | {"PYTHONPATH": hook.source}
    if launched.preflight is not None:
        sources["preflight_allreduce"] = launched.preflight.source
    sources["ENTRYPOINT_COLLECTIVE_TIMEOUT"] = timeouts.collective.source
    sources["DEEPSPEED_TIMEOUT"] = timeouts.deepspeed.source
    return _Environment(
        config=chosen.config.value,
        launch=spec,
        env=out,
        files={**chosen.files, **spec.files},
        sources=sources | spec.sources,
        notes=chosen.notes,
        warnings=(*chosen.warnings, *net_warnings, *timeouts.warnings),
    )
