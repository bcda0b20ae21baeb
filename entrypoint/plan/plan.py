"""The launch plan: a frozen value computed by pure code from (environment, hardware facts).
`make_plan` runs the steps in entrypoint.plan.plan_steps in order; this module is their sequence.

Precedence for every value: explicit ENTRYPOINT_* settings beat the platform's variables,
which beat probes, which beat defaults; `sources` records which one decided.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from entrypoint.plan import configs, gpus, launch_lines, launchers, network, ports, variables
from entrypoint.plan import plan_steps as steps
from entrypoint.plan.facts import Facts
from entrypoint.plan.launchers import ALLREDUCE, Launcher, Layout
from entrypoint.plan.plan_steps import BUILTIN_JOB, BUILTIN_JOBS, Out, gpus_stated, read_platform
from entrypoint.plan.platforms.base import Reading
from entrypoint.plan.settings import Settings
from entrypoint.plan.values import Source, derived

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
    # Spares and shrinking (entrypoint.control.roster): the nodes the platform started and this
    # node's index among them; `nnodes`/`node_rank` are the seat it trains in (the same without
    # them).
    members: int = 1
    member: int = 0
    spares: int = 0
    min_nodes: int = 1
    standby: bool = False  # a spare: joins, beats, starts no trainer until node 0 seats it
    metrics_port: int | None = None  # node 0's /metrics (entrypoint.control.metrics); None: off

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

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)


@dataclass(frozen=True)
class _Workers:
    """What the first half of `make_plan` decided: where and how the workers run."""

    master: str
    n_gpus: int
    device: str
    trainer: tuple[str, ...]
    launcher: Launcher
    nproc: int
    placed: tuple[int, int] | None
    devices: tuple[str, ...]
    layout: Layout
    adopted: launch_lines.Adopted | None = None  # the user's own launch line


def make_plan(
    env: Mapping[str, str],
    facts: Facts,
    command: Sequence[str] | None = None,
    read: tuple[str, str, Reading] | None = None,
    settings: Settings | None = None,
    seat: tuple[int, int] | None = None,
) -> Plan:
    """The plan for this node: platform reading -> seat -> GPU layout -> launcher and workers
    -> config -> network -> the launcher's command. `settings` and `read` when the caller has
    them (read once per run); `seat` (node rank, nnodes) when node 0 seated this node anew."""
    settings = settings or Settings.from_env(env)
    platform_name, why, reading = read or read_platform(env, settings)
    read_from = {k: getattr(reading, k).source for k in ("nnodes", "node_rank", "master_port")}
    out = Out(sources={"platform": derived(why), **read_from}, notes=list(reading.notes))
    out.warnings += [*reading.warnings, *variables.warnings(env, Settings.model_fields)]
    members, member = reading.nnodes.value, reading.node_rank.value
    reading, standby = steps.seated(reading, settings, seat, out.sources)
    nnodes, node_rank = reading.nnodes.value, reading.node_rank.value
    w = _workers(env, settings, reading, facts, command, out, member)
    launch, config = _environment(env, settings, facts, w, out)
    control = steps.choose_control_port(settings, reading, w.layout, out.sources)
    return Plan(
        platform=platform_name,
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=w.nproc,
        world_size=w.layout.world_size,
        master_addr=w.master,
        master_port=launch.master_port,
        control_port=control,
        metrics_port=ports.metrics_port(settings, launch.master_port, control, out.sources),
        spawn=w.layout.spawn,
        rank=w.layout.rank,
        local_rank=w.layout.local_rank,
        device=w.device,
        gpus_per_node=w.n_gpus,
        cuda_visible_devices=w.layout.cuda_visible,
        devices=w.devices,
        config=str(config.path),
        launcher=w.launcher,
        command=launch.command,
        trainer=w.trainer,
        env=out.env,
        files=out.files,
        sources=out.sources,
        hosts=reading.hosts,
        notes=tuple(out.notes),
        warnings=tuple(out.warnings),
        gpu_names=tuple(g.name for g in facts.gpus or ()),
        members=members,
        member=member,
        spares=settings.spares,
        min_nodes=settings.min_nodes or members - settings.spares,
        standby=standby,
        ranks=(w.placed[0], w.placed[0])
        if w.placed
        else (node_rank * w.nproc, node_rank * w.nproc + w.nproc - 1),
    )


def _workers(
    env: Mapping[str, str],
    settings: Settings,
    reading: Reading,
    facts: Facts,
    command: Sequence[str] | None,
    out: Out,
    member: int,
) -> _Workers:
    """GPUs, device, trainer, launcher, workers per node, this process's place, the layout."""
    nnodes = reading.nnodes.value
    master = steps.master(reading, nnodes, out.sources)
    n_gpus, visible, visible_from = gpus.count(env, settings, reading, facts, out.sources)
    device = gpus.device(settings, n_gpus, out.sources)
    spawn = reading.spawn.value
    out.sources["spawn"] = reading.spawn.source
    adopted = launch_lines.read(command, facts.launch_config, nnodes)
    if adopted is not None:
        command = adopted.trainer
        out.notes += steps.adopt(adopted, reading, spawn)
    trainer = steps.trainer(command, settings, out.sources, adopted)
    if adopted is not None and adopted.kind == "accelerate":
        launcher = steps.adopted_launcher(settings, out.sources)
    else:
        launcher = launchers.choose(settings, spawn, trainer == BUILTIN_JOBS["jax"], out.sources)
    nproc = steps.nproc(settings, reading, launcher, device, n_gpus, out.sources, adopted)
    out.sources["world_size"] = derived(f"nnodes {nnodes} x nproc_per_node {nproc}")
    placed = steps.placed(reading, out.sources)
    if placed:
        steps.inside(placed, nnodes, nproc, out.sources)
    chosen: list[str] = []
    if device == "cuda":
        chosen = visible if (launcher is Launcher.JAX or not spawn) else visible[:nproc]
        out.sources["cuda_visible_devices"] = visible_from
    cuda_visible = ",".join(chosen) if device == "cuda" else None
    layout = steps.layout(
        env, settings, reading, master, nproc, n_gpus, cuda_visible, facts.python, placed, member
    )
    return _Workers(
        master, n_gpus, device, trainer, launcher, nproc, placed, tuple(chosen), layout, adopted
    )


def _environment(
    env: Mapping[str, str], settings: Settings, facts: Facts, w: _Workers, out: Out
) -> tuple[launchers.Launch, configs.Config]:
    """The config and its batch split, the network, the trainer's variables, the launch."""
    nnodes = w.layout.nnodes
    cuda = w.device == "cuda"
    devices = nnodes * (w.n_gpus if w.launcher is Launcher.JAX and cuda else w.nproc)
    needs_config = w.trainer in BUILTIN_JOBS.values() or (
        w.launcher is Launcher.ACCELERATE and w.adopted is None  # a user's file has its own
    )
    config, deepspeed = steps.config(
        settings, w.device, devices, needs_config, w.layout.run_dir, out
    )
    net_env, net_sources, net_warnings = network.settle(
        env, facts, settings, nnodes=nnodes, device=w.device
    )
    out.env |= net_env | {"MASTER_ADDR": w.master}
    out.sources |= net_sources
    out.warnings += net_warnings
    if w.layout.cuda_visible is not None:
        out.env["CUDA_VISIBLE_DEVICES"] = w.layout.cuda_visible
    steps.device_env(env, settings, facts, w.device, w.nproc, out)
    steps.site_hook(env, out)
    launch = steps.launch(
        env, settings, w.trainer, w.launcher, w.layout, config, deepspeed, out, w.adopted
    )
    return launch, config
