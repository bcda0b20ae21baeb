"""`entrypoint doctor`'s report: everything it says as one JSON-ready dict (`report`, what
`doctor --json` prints), and that dict as sections of `name  value` lines for a terminal
(`table`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from entrypoint.doctor.cuda_kernels import coverage
from entrypoint.doctor.doctor_checks import Findings, Port, mib, port_meaning
from entrypoint.plan import network

if TYPE_CHECKING:
    from entrypoint.plan.facts import Facts
    from entrypoint.plan.node_plan import Plan
    from entrypoint.plan.settings import Settings


def report(
    plan: Plan, facts: Facts, found: Findings, settings: Settings, found_problems: list[str]
) -> dict:
    """Everything doctor says, as one JSON-ready dict."""
    iface, why = network.choose_interface(facts, settings)
    node0 = plan.node_rank == 0
    return {
        "node": {
            "hostname": facts.hostname,
            "node_rank": plan.node_rank,
            "nnodes": plan.nnodes,
            "platform": plan.platform,
        },
        "system": {
            "os": found.os,
            "kernel": found.kernel,
            "arch": found.arch,
            "python": found.python,
            "python_path": found.python_path,
            "image_lock": found.image_lock,
            "image_revision": found.image_revision,
        },
        "software": _software(found),
        "kernels": _kernels(found),
        "gpus": {
            "driver": found.driver,
            "driver_cuda": found.driver_cuda,
            "probe": facts.gpu_probe,
            "devices": [asdict(g) for g in facts.gpus or ()],
        },
        "network": {
            "interfaces": [asdict(nic) for nic in facts.interfaces],
            "chosen": iface,
            "why": str(why),
            "ib_hcas": list(facts.ib_hcas),
            "shm_bytes": found.shm_bytes,
        },
        "master": {
            "address": plan.master_addr,
            "resolved": facts.master_ip,
            "this_node": node0,
            "checked": plan.nnodes > 1,
            "ports": [_port(port, node0) for port in found.ports],
        },
        "plan": plan.to_dict(),
        "problems": list(found_problems),
        "ok": not found_problems,
        "allreduce": None,
    }


def _software(found: Findings) -> dict:
    return {
        "torch": found.torch,
        "torch_error": found.torch_error,
        "cuda_runtime": found.cuda_runtime,
        "torch_cuda_devices": found.torch_gpus,
        "jax": found.jax,
        "jax_devices": found.jax_devices,
        "jax_error": found.jax_error,
        "deepspeed": found.deepspeed,
        "nccl": found.nccl,
        "nccl_source": found.nccl_source,
    }


def _kernels(found: Findings) -> list[dict]:
    """Each prebuilt CUDA op: its cubins and PTX, and what that means on this node's GPUs."""
    return [
        {
            "op": ops.op,
            "cubins": [f"sm_{a}" for a in ops.cubins],
            "ptx": [f"compute_{a}" for a in ops.ptx],
            "gpus": {cap: coverage(cap, ops) for cap in found.gpu_capabilities},
        }
        for ops in found.cuda_ops
    ]


def _port(port: Port, node0: bool) -> dict:
    meaning, bad = port_meaning(port, node0)
    return {
        "name": port.name,
        "variable": port.variable,
        "port": port.port,
        "state": port.state,
        "meaning": meaning,
        "problem": bad,
    }


def table(rep: dict, plan_table: str) -> str:
    """The report for a terminal: sections of `name  value` lines, the plan, the problems."""
    node = rep["node"]
    rows = _machine_rows(rep["system"], rep["software"], rep["gpus"])
    rows += _kernel_rows(rep["kernels"])
    rows += _network_rows(rep["network"], rep["master"], node["nnodes"])
    width = max(len(name) for name, _ in rows)
    lines = [
        (
            f"entrypoint doctor: node {node['node_rank']} of {node['nnodes']} "
            f"({node['hostname']}), platform {node['platform']}"
        )
    ]
    for name, value in rows:
        lines.append(f"\n{name}" if not value else f"  {name:<{width}}  {value}")
    lines.append("\nplan")
    lines += [f"  {line}" if line else "" for line in plan_table.splitlines()]
    lines.append("\nproblems" + ("" if rep["problems"] else ": none"))
    lines += [f"  - {p}" for p in rep["problems"]]
    return "\n".join(lines)


def _machine_rows(s: dict, sw: dict, g: dict) -> list[tuple[str, str]]:
    """The system, software and GPU sections."""
    torch_line = (
        f"{sw['torch']} (CUDA runtime {sw['cuda_runtime'] or 'none'}), "
        f"GPUs seen: {sw['torch_cuda_devices']}"
        if sw["torch"]
        else f"does not import ({sw['torch_error']})"
    )
    rows: list[tuple[str, str]] = [
        ("system", ""),
        ("OS", f"{s['os']}, kernel {s['kernel']}, {s['arch']}"),
        ("Python", f"{s['python']} ({s['python_path']})"),
        (
            "image",
            f"lock {s['image_lock'][:12]}, revision {(s['image_revision'] or '?')[:12]}"
            if s["image_lock"]
            else "none (not running in the image)",
        ),
        ("software", ""),
        ("torch", torch_line),
        (
            "JAX",
            f"{sw['jax']}, devices: " + (sw["jax_devices"] or f"none ({sw['jax_error']})")
            if sw["jax"]
            else f"does not import ({sw['jax_error']})"
            if sw["jax_error"]
            else "not installed",
        ),
        ("DeepSpeed", sw["deepspeed"] or "not installed"),
        ("NCCL", f"{sw['nccl'] or 'not installed'} ({sw['nccl_source']})"),
        ("GPUs", ""),
        (
            "driver",
            f"{g['driver']} (CUDA {g['driver_cuda']})" if g["driver"] else f"none ({g['probe']})",
        ),
    ]
    for gpu in g["devices"]:
        memory = f", {gpu['memory_mib']} MiB" if gpu["memory_mib"] else ""
        rows.append((f"GPU {gpu['index']}", f"{gpu['name'] or 'unknown model'}{memory}"))
    if not g["devices"]:
        rows.append(("GPUs", "none: workers run on CPU (gloo)"))
    return rows


def _network_rows(net: dict, m: dict, nnodes: int) -> list[tuple[str, str]]:
    """The network and master sections."""
    chosen = f"{net['chosen']} [{net['why']}]" if net["chosen"] else f"none [{net['why']}]"
    rows: list[tuple[str, str]] = [
        ("network", ""),
        (
            "interfaces",
            ", ".join(f"{n['name']} {n['address'] or '-'}" for n in net["interfaces"]) or "none",
        ),
        ("NCCL/gloo use", chosen if nnodes > 1 else "loopback (single node)"),
        ("InfiniBand", ", ".join(net["ib_hcas"]) or "none"),
        ("/dev/shm", mib(net["shm_bytes"]) if net["shm_bytes"] is not None else "unknown"),
        ("master", ""),
    ]
    if m["checked"]:
        rows.append(
            (
                "address",
                f"{m['address']} -> {m['resolved'] or 'does not resolve'}"
                + (" (this node is node 0)" if m["this_node"] else ""),
            )
        )
        for port in m["ports"]:
            rows.append((f"{port['name']} port", f"{port['port']}: {port['meaning']}"))
    else:
        rows.append(("address", f"{m['address']} (single node: nothing to reach)"))
    return rows


_VERDICT = {
    "native": "native kernels",
    "ptx": "PTX only: the driver compiles it at the op's first load",
    "none": "no kernel: the op cannot run here",
}


def _kernel_rows(kernels: list[dict]) -> list[tuple[str, str]]:
    """DeepSpeed's prebuilt CUDA ops: what they hold, what this node's GPUs get."""
    rows: list[tuple[str, str]] = [("CUDA kernels", "")] if kernels else []
    for k in kernels:
        held = " ".join(k["cubins"]) + (" + PTX " + " ".join(k["ptx"]) if k["ptx"] else "")
        rows.append((k["op"], held))
        for cap, verdict in k["gpus"].items():
            rows.append((f"  on {cap}", _VERDICT[verdict]))
    return rows
