"""This node's run, shared by `run` and `doctor`: read the settings once, read the platform,
probe what the plan needs, make the plan; then check it against the node, write its files,
join the other nodes and supervise the launcher."""

from __future__ import annotations

import importlib.util
import ipaddress
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from entrypoint.plan import secrets
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.facts import Facts
from entrypoint.plan.node_plan import BUILTIN_JOBS, Plan, gpus_stated, make_plan, read_platform
from entrypoint.plan.settings import Settings
from entrypoint.plan.values import host_port
from entrypoint.supervise import probe

if TYPE_CHECKING:
    from entrypoint.supervise.logs import Logger

# run_plan's modules (the supervisor, the control channel, structlog) load when it runs:
# `entrypoint plan` and `doctor` need only prepare's (a plan in under 300 ms, tests/unit/
# test_shape.py).


def prepare(
    env: Mapping[str, str], trainer: Sequence[str] | None, *, always_probe_gpus: bool
) -> tuple[Plan, Facts, Settings]:
    """What `run` and `doctor` share: the settings, the platform's reading, the probes, the plan.

    Args:
        env: the environment as the platform gave it.
        trainer: the trainer's command line (a `torchrun ...` line is adopted), or None for
            the built-in job.
        always_probe_gpus: probe the GPUs even where the settings say how many there are.

    Returns:
        (the frozen plan, the facts probed, the settings).

    Raises:
        ConfigError: a setting or a platform variable is wrong; its line names it and the fix.
    """
    settings = Settings.from_env(env)  # a bad setting is reported before any probe
    read = read_platform(env, settings)
    reading = read[2]
    master = reading.master_addr.value if reading.master_addr else None
    facts = probe.facts(
        master_addr=master if reading.nnodes.value > 1 else None,
        probe_gpus=always_probe_gpus or not gpus_stated(settings, reading),
        command=trainer,
    )
    return make_plan(env, facts, trainer, read=read, settings=settings), facts, settings


def master_resolved(plan: Plan, facts: Facts, waited: float, log: Logger) -> Facts | None:
    """The facts with the master's address, when a name that did not resolve at the first
    probe does now; None when nothing changes (an address, a name resolved from the start, one
    node, or a name that still does not resolve: then a warning)."""
    name = plan.master_addr
    if plan.nnodes == 1 or facts.master_ip is not None or not name or is_ip(name):
        return None
    fresh = probe.master_resolved(facts, name, waited)
    if fresh.master_ip is None:
        log.warning(
            f"the master's name {name} still does not resolve here: the socket family and "
            "interface stay undecided (NCCL picks); set NCCL_SOCKET_FAMILY and "
            "ENTRYPOINT_SOCKET_IFNAME if the job runs over IPv6"
        )
        return None
    log.info(
        f"the master's name {name} resolved to {fresh.master_ip} {waited:.1f} s after the "
        "start: the socket family and the interface are decided from it"
    )
    return fresh


def _say_plan(plan: Plan, settings: Settings, log: Logger, values: tuple[str, ...]) -> None:
    """The plan: in JSON, one event with every value and its source (every line is JSON); for
    a person, node 0's table and one line from each other node (plan.json has the rest)."""
    from entrypoint.supervise import logs, report

    if not logs.console(settings.log_format):
        log.info(
            "plan",
            platform=plan.platform,
            nnodes=plan.nnodes,
            nproc_per_node=plan.nproc_per_node,
            world_size=plan.world_size,
            master=host_port(plan.master_addr, plan.master_port or "auto"),
            device=plan.device,
            cuda_visible_devices=plan.cuda_visible_devices,
            config=plan.config,
            launcher=str(plan.launcher),
            ranks=report.rank_line(plan),
            command=plan.command,
            sources={name: str(source) for name, source in plan.sources.items()},
        )
    elif plan.node_rank == 0:
        logs.writer().put(report.table(plan, values), to_file=False)
    else:
        log.info(f"plan: {report.rank_line(plan)}, {plan.device}, launcher {plan.launcher}")


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return False
    return True


def run_plan(plan: Plan, facts: Facts, env: Mapping[str, str], settings: Settings) -> int:
    """Check the plan against this node, write its configs, then join the other nodes and
    supervise the launcher (`run`, and `doctor --allreduce` with its own trainer)."""
    from entrypoint.supervise import dsops, logs, preflight, supervisor

    values = secrets.secret_values(env)
    log = logs.for_node(settings, plan.member, values)
    started = time.monotonic()
    preflight.check_hardware(plan, env, facts)
    if plan.trainer in BUILTIN_JOBS.values() and importlib.util.find_spec(plan.trainer[2]) is None:
        raise ConfigError(
            "command",
            None,
            "no trainer command given and this build has no built-in job",
            "Pass one after --, e.g. entrypoint run -- python train.py",
        )
    for warning in plan.warnings:
        log.warning(warning)
    for note in plan.notes:
        log.info(note)
    _say_plan(plan, settings, log, values)
    preflight.check_command(plan, env)
    dsops.check(plan, preflight.child_env(plan, env))  # a DeepSpeed op the image lacks: say so now
    env = _prebuilt_ops_lockable(env, settings, log)
    if plan.standby:
        log.info(
            f"standby: node {plan.member} of {plan.members} stands by "
            f"(ENTRYPOINT_SPARES={plan.spares}); it takes a lost node's rank"
        )
    else:
        log.info("start", command=secrets.mask(shlex.join(plan.command), values))

    known = [facts]  # the facts plans are made from: the master's address once it resolves

    def replan(seat: int, nnodes: int, master: str | None) -> tuple[Plan, dict[str, str]]:
        again = make_plan(
            env, known[0], plan.trainer, settings=settings, seat=(seat, nnodes), master=master
        )
        return again, _trainer_env(again, env, settings)

    def resolved() -> tuple[Plan, dict[str, str]] | None:
        """After the join (the master's name resolved for it), a plan from its address when
        the first probe could not resolve it (a headless Service's names appear once the pods
        are ready): NCCL's socket family and interface from the address, not from a guess."""
        fresh = master_resolved(plan, known[0], time.monotonic() - started, log)
        if fresh is None:
            return None
        known[0] = fresh
        again = make_plan(env, fresh, plan.trainer, settings=settings)
        _say_plan(again, settings, log, values)  # the plan the launcher starts with
        return again, _trainer_env(again, env, settings)

    trainer_env = _trainer_env(plan, env, settings)
    return supervisor.run(plan, trainer_env, settings, log, replan, resolved)


def _prebuilt_ops_lockable(
    env: Mapping[str, str], settings: Settings, log: Logger
) -> dict[str, str]:
    """On a read-only root, DeepSpeed's prebuilt CPU ops linked where torch can take their
    lock, and the trainer's TORCH_EXTENSIONS_DIR there (trainer_side/prebuilt_ops.py)."""
    from entrypoint.trainer_side import prebuilt_ops

    out, level, line = prebuilt_ops.writable_extensions(env, Path(settings.run_dir))
    if level:
        getattr(log, level)(line)
    return out


def _trainer_env(plan: Plan, env: Mapping[str, str], settings: Settings) -> dict[str, str]:
    """The plan's files written for this node, and the trainer's environment with them."""
    from entrypoint.supervise import preflight

    plan_file = preflight.apply(plan, Path(settings.run_dir) / f"node{plan.member}")
    return preflight.child_env(plan, env) | {"ENTRYPOINT_PLAN_FILE": str(plan_file)}
