"""accelerate's config for one node of the job: a user's config file's settings with this
cluster's numbers in place of those written there. Pure, and shared by the two places that adopt
an `accelerate launch` line: the plan, for a line given to the entrypoint (plan/launchers.py),
and the site hook, for one a start script runs (inner_launcher.py), which may not import the
plan."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

# Where a user's accelerate names the platform, in its config file; the entrypoint writes them.
PLATFORM_KEYS = ("num_machines", "machine_rank", "num_processes", "main_process_ip",
                 "main_process_port", "rdzv_backend", "same_network", "deepspeed_hostfile",
                 "mpirun_hostfile")  # fmt: skip


class CannotRun(Exception):
    """The file cannot run on this node: (the setting, its value, why, the fix)."""


class Numbers(NamedTuple):
    nnodes: int
    node_rank: int
    world_size: int  # accelerate's num_processes counts every node's
    nproc_per_node: int
    master_addr: str
    master_port: int


def cluster_numbers(n: Numbers) -> dict[str, object]:
    return {
        "num_machines": n.nnodes,
        "machine_rank": n.node_rank,
        "num_processes": n.world_size,
        "main_process_ip": n.master_addr,
        "main_process_port": n.master_port,
        "rdzv_backend": "static",
    }


def read(path: str, text: str | None, where: str = "") -> dict[str, Any]:
    """The config file's settings, from its text (None: it could not be read on this node);
    CannotRun naming the file when it cannot be read or is not accelerate's YAML. `where` goes
    before what is wrong (`in your accelerate launch line `)."""
    if text is None:
        raise CannotRun(
            "--config_file",
            path,
            f"{where}cannot be read on this node",
            "Put the file in the image or on a volume every node mounts, at that path",
        )
    try:
        import yaml  # accelerate's own dependency: the image has it

        loaded = yaml.safe_load(text)
    except ImportError:  # pragma: no cover - the image has PyYAML
        raise CannotRun(
            "--config_file", path, "needs PyYAML to be read", "pip install pyyaml"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise CannotRun(
            "--config_file",
            path,
            f"{where}is not valid YAML{at}",
            "Fix the file (`accelerate config` writes one)",
        ) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise CannotRun(
            "--config_file",
            path,
            "holds no settings (not a mapping)",
            "Give accelerate's config file (`accelerate config` writes one)",
        )
    return loaded


def for_node(
    config: Mapping[str, Any], n: Numbers, on_cpu: bool, config_file: str | None
) -> tuple[dict[str, Any], str]:
    """The config's settings with the cluster's numbers, and a note on what else was changed
    (empty when nothing was). On CPU nodes a MULTI_CPU config (or none) runs accelerate's
    multi-process launcher, a process a worker with gloo (trainer_side/accelerate_cpu.py),
    where accelerate would start one process a machine; on GPU nodes a MULTI_CPU config is
    refused (CannotRun)."""
    body = dict(config) | cluster_numbers(n) | {"same_network": True}
    body.pop("deepspeed_hostfile", None)  # pdsh's list of hosts: the platform starts the nodes
    body.pop("mpirun_hostfile", None)
    written = body.get("distributed_type")
    cpu_type = written is None or str(written).upper() == "MULTI_CPU"
    note = ""
    if on_cpu:
        body["use_cpu"] = True
        if cpu_type and n.world_size > 1:
            body["distributed_type"] = "MULTI_GPU"
            note = (
                f"; distributed_type {written or '(none)'} run by accelerate's multi-process "
                f"launcher, {n.nproc_per_node} per node, with gloo (with MULTI_CPU "
                "accelerate starts one process per machine)"
            )
    elif written is None:  # accelerate's own default is one process
        body["distributed_type"] = "MULTI_GPU"
    elif cpu_type:
        raise CannotRun(
            f"distributed_type in {config_file}",
            written,
            "asks accelerate for CPU processes, one per machine, but this node runs "
            f"{n.nproc_per_node} workers on its GPUs",
            "Set distributed_type: MULTI_GPU (or DEEPSPEED, FSDP) in the file, or run on CPU nodes",
        )
    return body, note


def as_yaml(body: Mapping[str, object]) -> str:
    # JSON is YAML: no YAML library needed, and every string comes out quoted.
    return json.dumps(body, indent=2, sort_keys=True, default=str) + "\n"
