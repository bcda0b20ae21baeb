"""The edge that acts: check the plan against what the probes found, write the generated
configs, then replace this process with the launcher."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.facts import Facts
from entrypoint.plan.gpus import visible_ids
from entrypoint.plan.node_plan import Plan
from entrypoint.plan.values import Kind

_FIX_NO_GPU = (
    "Start the container with --gpus all (Docker) or the NVIDIA runtime "
    "(runtimeClassName: nvidia, nvidia.com/gpu limits on Kubernetes), or set "
    "ENTRYPOINT_DEVICE=cpu"
)


def _stated_variable(plan: Plan) -> str:
    source = plan.sources.get("gpus_per_node")
    return source.names("GPUs") if source is not None and source.kind is Kind.ENV else "GPUs"


def check_hardware(plan: Plan, env: Mapping[str, str], facts: Facts) -> None:
    """Refuse a plan that the node cannot carry: stated GPUs the probe does not find."""
    if plan.device != "cuda" or facts.gpus is None:
        return
    visible, how = visible_ids(env, facts)
    have = len(visible or ())
    variable = _stated_variable(plan)
    if have == 0:
        raise ConfigError(
            variable,
            plan.gpus_per_node,
            f"promises {plan.gpus_per_node} GPUs but this container sees none ({how})",
            _FIX_NO_GPU,
        )
    if plan.gpus_per_node > have:
        raise ConfigError(
            variable,
            plan.gpus_per_node,
            f"asks for {plan.gpus_per_node} GPUs but this node has {have} ({how})",
            f"Ask for at most {have} per node; a 2 x 8 job is not 1 x 16",
        )
    if not plan.spawn and plan.local_rank is not None and plan.local_rank >= have:
        raise ConfigError(
            "LOCAL_RANK",
            plan.local_rank,
            f"but this node has {have} GPUs ({how})",
            "Start at most one task per GPU on each node",
        )


def child_env(plan: Plan, env: Mapping[str, str]) -> dict[str, str]:
    out = dict(env)
    for key, value in plan.env.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def apply(plan: Plan, run_dir: Path) -> Path:
    """Write the generated configs and the plan itself; return the plan file's path."""
    for path, text in plan.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    run_dir.mkdir(parents=True, exist_ok=True)
    plan_file = run_dir / "plan.json"
    plan_file.write_text(plan.to_json(indent=2) + "\n")
    return plan_file


def check_command(plan: Plan, env: Mapping[str, str]) -> None:
    program = plan.command[0]
    if shutil.which(program, path=env.get("PATH")) is None and not os.path.exists(program):
        raise ConfigError(
            "command",
            program,
            "is not an executable on PATH",
            "Check the trainer command after --, e.g. -- python train.py",
        )


def plan_from_file(path: str) -> dict:
    return json.loads(Path(path).read_text())
