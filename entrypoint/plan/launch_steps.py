"""The steps of `make_plan` (entrypoint.plan.node_plan) from the layout on: the config and its batch
split, the trainer's variables, the launcher's command, node 0's control port. Each is a pure
function that returns what it decided; `make_plan` alone puts it into the plan."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from entrypoint.plan import configs, launchers, ports
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.facts import Facts
from entrypoint.plan.launch_lines import Adopted
from entrypoint.plan.launchers import Launcher, LaunchSpec, Layout
from entrypoint.plan.platforms.base import Reading
from entrypoint.plan.settings import PREFIX, Settings
from entrypoint.plan.values import Source, Sourced, derived, env_var
from entrypoint.trainer_side import jax_cluster


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
