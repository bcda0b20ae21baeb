"""Hostile environments for the path environment -> plan, shared by the property tests
(tests/unit/test_hostile.py, drawn by hypothesis) and the fuzz run (benchmarks/fuzz_env.py,
drawn by `random`): one valid environment per platform convention, each variable kept, dropped
or replaced by a value from a pool of what adversarial users and broken platforms pass, plus
stray variables and settings. `pick(sequence)` is the only source of choices, so both drawers
share every case.

`plan_once` runs what `entrypoint plan` and `run` run before launching anything
(entrypoint.supervise.node report.table, plan --json, launch.check_hardware); `violations` lists the
plan invariants a plan breaks.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence

from entrypoint.plan import platforms, secrets
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.facts import Facts, Gpu, Interface
from entrypoint.plan.node_plan import Plan, gpus_stated, make_plan, read_platform
from entrypoint.plan.settings import Settings
from entrypoint.plan.values import GPUS, NODES, PER_NODE, host
from entrypoint.supervise import report
from entrypoint.supervise.preflight import check_hardware

Pick = Callable[[Sequence], object]

# A valid environment of node 1 in a 2-node job, one per platform convention: each platform's
# EXAMPLES, in its table of cases (tests/unit/test_platforms_<name>.py, where its variables are
# documented).
TEMPLATES: dict[str, dict[str, str]] = {
    name: env
    for platform in platforms.ORDER
    for name, env in importlib.import_module(f"test_platforms_{platform}").EXAMPLES.items()
}

NUMBERS = [
    "0",
    "1",
    "2",
    "3",
    "7",
    "8",
    "9",
    "15",
    "16",
    "17",
    "64",
    "256",
    "257",
    "1023",
    "1024",
    "1025",
    "65535",
    "65536",
    "65537",
    "1048576",
    "1048577",
    "99999999999999999999",
    "1" + "0" * 30,
    "9" * 5000,
    "0" * 5000,
    "0" * 4999 + "1",
    "-1",
    "+1",
    "++1",
    "²",
    "١٢",
    "1_000",
    "1e3",
    "0x10",
    " 2 ",
    "02",
    "2.5",
    "nan",
    "inf",
    "-0",
]
BLANKS = ["", " ", "\t", "\n"]
HOSTS = [
    "10.0.0.1",
    "127.0.0.1",
    "localhost",
    "node-0",
    "::1",
    "[::1]",
    "fe80::1%eth0",
    "fe80::1",
    "[fd00::2]",
    "fd00::2%eth0",
    "[fe80::1]:29500",
    "::1:29500",
    "10.0.0.1:29500",
    "worker 0",
    "host\nevil",
    "ünï",
    "a" * 300,
    "-x",
    "x-",
    "1.2.3.256",
    "010.0.0.1",
    "tcp://h:1",
    "h/x",
    "a,b",
    "a..b",
    "node_1.svc.cluster.local.",
]
LISTS = [
    "node[0-999999999]",
    "node[0-3]",
    "n1,n1",
    "gpu-[01-02]",
    "a[1-2]b[1-2]",
    "x[2-1]",
    "n[1-",
    "n[08-11]",
    "n[²-3]",
    "n[" + "1," * 5000 + "2]",
    '["algo-1","algo-2"]',
    '["algo-2"]',
    '["algo-1","algo-1"]',
    "[" * 5000 + "]" * 5000,
    '{"a": 1}',
    "[]",
    '["::1","algo-2"]',
    "10.0.0.1\n10.0.0.2",
    "10.0.0.2\n10.0.0.2",
    "\n".join(f"10.0.{i // 256}.{i % 256}" for i in range(2)),
    "1(x2)",
    "8(x2)",
    "2(x0)",
    "8(x65537)",
    "8(x2),4",
    "2,2",
    "(x2)",
    "8(x²)",
]
DEVICES = [
    "0,0",
    "-1",
    "0,1",
    "1,0",
    "GPU-0001",
    "GPU-0001,GPU-0001",
    "MIG-abc/1/0",
    "all",
    "0,,1",
    "7",
    "8",
    "63",
    "255",
    "256",
    "0,1,2,3,4,5,6,7",
    "0,1,2,3,4,5,6,7,8",
    "0,-1",
    "void",
    "none",
    "GPU-xyz,0",
]
WORDS = [
    "auto",
    "cuda",
    "cpu",
    "gpu",
    "jax",
    "accelerate",
    "torchrun",
    "direct",
    "deepspeed",
    "slurm",
    "local",
    "mpi",
    "commercial",
    "sagemaker",
    "processes",
    "nodes",
    "true",
    "false",
    "8gpu",
    "cpu",
    "nonexistent",
]
VALUES = NUMBERS + BLANKS + HOSTS + LISTS + DEVICES + WORDS

SETTINGS = [
    "ENTRYPOINT_PLATFORM",
    "ENTRYPOINT_NNODES",
    "ENTRYPOINT_NODE_RANK",
    "ENTRYPOINT_MASTER_ADDR",
    "ENTRYPOINT_MASTER_PORT",
    "ENTRYPOINT_GPUS_PER_NODE",
    "ENTRYPOINT_NPROC_PER_NODE",
    "ENTRYPOINT_DEVICE",
    "ENTRYPOINT_LAUNCHER",
    "ENTRYPOINT_JOB",
    "ENTRYPOINT_CONTROL_PORT",
    "ENTRYPOINT_HEARTBEAT_INTERVAL",
    "ENTRYPOINT_HEARTBEAT_TIMEOUT",
    "ENTRYPOINT_JOIN_TIMEOUT",
    "ENTRYPOINT_WORLD_SIZE_MEANS",
    "ENTRYPOINT_CONFIG",
    "ENTRYPOINT_XLA_MEM_FRACTION",
    "ENTRYPOINT_COLLECTIVE_TIMEOUT",
    "ENTRYPOINT_PREFLIGHT_ALLREDUCE",
]
STRAYS = (
    sorted(platforms.variables())
    + SETTINGS
    + ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "VC_X_HOSTS", "VC_X_NUM", "HF_TOKEN"]
)
COMMANDS = [
    None,
    ("python", "train.py"),
    ("python", "-c", "print(1)"),
    ("bash", "-c", "true"),
    ("python", "-m", "pkg"),
]
GPU_COUNTS = [None, 0, 1, 2, 8]


def facts(gpus: int | None) -> Facts:
    """A node as the probes would describe it: `gpus` None means not probed."""
    return Facts(
        hostname="node",
        python="/venv/bin/python",
        cpu_count=16,
        gpus=None
        if gpus is None
        else tuple(
            Gpu(index=i, uuid=f"GPU-{i:04d}", name="NVIDIA H100 80GB HBM3", memory_mib=81559)
            for i in range(gpus)
        ),
        gpu_probe="not probed" if gpus is None else "probe nvml",
        interfaces=(Interface("lo", "127.0.0.1"), Interface("eth0", "10.0.0.2")),
        route_to_master="eth0",
        default_route="eth0",
        master_ip="10.0.0.1",
    )


def draw(pick: Pick, template: str | None = None):
    """(env, facts, command): one hostile case for `template` (any, when None)."""
    name = template if template is not None else pick(sorted(TEMPLATES))
    env: dict[str, str] = {}
    for key, value in TEMPLATES[name].items():
        action = pick(("keep", "keep", "keep", "drop", "replace"))
        if action == "keep":
            env[key] = value
        elif action == "replace":
            env[key] = pick(VALUES)
    for _ in range(pick((0, 0, 1, 1, 2, 3, 5))):
        env[pick(STRAYS)] = pick(VALUES)
    return env, facts(pick(GPU_COUNTS)), pick(COMMANDS)


def plan_once(env: dict[str, str], node: Facts, command) -> Plan:
    """What `plan` and `run` do before anything starts, in process (cli._prepare with the probes'
    facts given: entrypoint.supervise.node.prepare; the printed table and JSON; run's hardware
    check)."""
    settings = Settings.from_env(env)
    read = read_platform(env, settings)
    gpus_stated(settings, read[2])
    plan = make_plan(env, node, list(command) if command else None, read=read, settings=settings)
    values = secrets.secret_values(env)
    report.table(plan, values)
    json.loads(plan.to_json())
    secrets.mask(plan.to_json(), values)
    check_hardware(plan, env, node)
    return plan


def violations(plan: Plan, node: Facts) -> list[str]:
    """The invariants every plan keeps; each broken one, named."""
    out = []
    if not 1 <= plan.nnodes <= NODES.high:
        out.append(f"nnodes {plan.nnodes} outside 1..{NODES.high}")
    if not 0 <= plan.node_rank < plan.nnodes:
        out.append(f"node_rank {plan.node_rank} not in 0..{plan.nnodes - 1}")
    if not 1 <= plan.nproc_per_node <= PER_NODE.high:
        out.append(f"nproc_per_node {plan.nproc_per_node} outside 1..{PER_NODE.high}")
    if plan.world_size != plan.nnodes * plan.nproc_per_node:
        out.append(f"world_size {plan.world_size} != {plan.nnodes} x {plan.nproc_per_node}")
    if not 0 <= plan.gpus_per_node <= GPUS.high:
        out.append(f"gpus_per_node {plan.gpus_per_node} outside 0..{GPUS.high}")
    if not plan.spawn:
        if plan.rank is None or not 0 <= plan.rank < plan.world_size:
            out.append(f"rank {plan.rank} not in 0..{plan.world_size - 1}")
        if plan.local_rank is None or not 0 <= plan.local_rank < plan.nproc_per_node:
            out.append(f"local_rank {plan.local_rank} not in 0..{plan.nproc_per_node - 1}")
    first, last = plan.ranks
    if not 0 <= first <= last < plan.world_size:
        out.append(f"ranks {plan.ranks} outside the world of {plan.world_size}")
    for name in ("master_port", "control_port"):
        port = getattr(plan, name)
        if port is not None and not 1 <= port <= 65535:
            out.append(f"{name} {port} outside 1..65535")
    if plan.control_port is not None and plan.control_port == plan.master_port:
        out.append(f"control_port {plan.control_port} is the master port")
    try:
        host("master_addr", plan.master_addr)
    except ConfigError as err:
        out.append(f"master_addr {plan.master_addr!r} is not one host: {err}")
    for line in (*plan.notes, *plan.warnings, *map(str, plan.sources.values())):
        if "\n" in line:
            out.append(f"a note, warning or source of more than one line: {line[:200]!r}")
    if plan.cuda_visible_devices is not None:
        ids = plan.cuda_visible_devices.split(",")
        if len(set(ids)) != len(ids):
            out.append(f"CUDA_VISIBLE_DEVICES {plan.cuda_visible_devices} names a GPU twice")
        if node.gpus is not None:
            mine = {str(g.index) for g in node.gpus} | {g.uuid for g in node.gpus}
            if not set(ids) <= mine:
                out.append(
                    f"CUDA_VISIBLE_DEVICES {plan.cuda_visible_devices} not a subset of "
                    f"this node's {sorted(mine)}"
                )
    return out
