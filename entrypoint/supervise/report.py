"""The plan, readable: what this node will do, and where each value came from."""

from __future__ import annotations

import shlex

from entrypoint.plan import secrets
from entrypoint.plan.node_plan import Plan
from entrypoint.plan.values import host_port


def rank_line(plan: Plan) -> str:
    first, last = plan.ranks
    here = f"ranks {first}-{last}" if last > first else f"rank {first}"
    where = (
        plan.hosts[plan.node_rank] if len(plan.hosts) > plan.node_rank else f"node {plan.node_rank}"
    )
    line = f"{here} on {where}"
    if plan.spawn and plan.hosts and len(plan.hosts) <= 8:
        n = plan.nproc_per_node
        line = ", ".join(
            (f"ranks {i * n}-{i * n + n - 1}" if n > 1 else f"rank {i}") + f" on {host}"
            for i, host in enumerate(plan.hosts)
        )
    return line


def table(plan: Plan, secret_values: tuple[str, ...] = ()) -> str:
    src = plan.sources
    rows = [
        ("platform", plan.platform, src.get("platform")),
        (
            "nodes",
            f"{plan.nnodes} (this is node {plan.node_rank})",
            f"{src.get('nnodes')}; {src.get('node_rank')}",
        ),
        ("workers per node", plan.nproc_per_node, src.get("nproc_per_node")),
        ("world size", plan.world_size, src.get("world_size")),
        ("ranks", rank_line(plan), "spawned here" if plan.spawn else src.get("spawn")),
        (
            "master",
            host_port(plan.master_addr, plan.master_port or "auto"),
            f"{src.get('master_addr')}; {src.get('master_port')}",
        ),
        ("control port", plan.control_port or "auto", src.get("control_port")),
        ("metrics port", plan.metrics_port or "off", src.get("metrics_port")),
        (
            "device",
            plan.device + (f" x {plan.gpus_per_node}" if plan.device == "cuda" else ""),
            f"{src.get('device')}; GPUs: {src.get('gpus_per_node')}",
        ),
        (
            "CUDA_VISIBLE_DEVICES",
            plan.cuda_visible_devices or "-",
            src.get("cuda_visible_devices", ""),
        ),
        ("config", plan.config or "-", src.get("config")),
        ("launcher", plan.launcher, src.get("launcher")),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [
        f"{name:<{width}}  {value}" + (f"    [{why}]" if why else "") for name, value, why in rows
    ]
    lines.append("")
    lines.append("environment for the trainer:")
    for key, value in plan.env.items():
        why = src.get(key)
        lines.append(
            f"  {key}={'(unset)' if value is None else value}" + (f"    [{why}]" if why else "")
        )
    for path in plan.files:
        lines.append(f"writes {path}")
    lines.append("")
    lines.append("command: " + shlex.join(plan.command))  # copy-pastable
    for note in plan.notes:
        lines.append(f"note: {note}")
    for warning in plan.warnings:
        lines.append(f"WARNING: {warning}")
    return secrets.mask("\n".join(lines), secret_values)
