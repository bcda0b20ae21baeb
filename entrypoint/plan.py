"""The launch plan: a frozen value computed by pure code from (environment, hardware facts).

Precedence for every value: explicit ENTRYPOINT_* settings beat the platform's variables,
which beat probes, which beat defaults; `sources` records which one decided.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from entrypoint import configs, jax_cluster, network, platforms
from entrypoint.errors import ConfigError
from entrypoint.facts import Facts
from entrypoint.platforms.base import Reading
from entrypoint.settings import PREFIX, Settings
from entrypoint.values import Sourced, below, variable_of

# The image's built-in jobs (entrypoint/job), run when no trainer command is given.
BUILTIN_JOBS = {"deepspeed": ("python", "-m", "entrypoint.job"),
                "jax": ("python", "-m", "entrypoint.job.jax_train")}
BUILTIN_JOB = BUILTIN_JOBS["deepspeed"]
# `entrypoint doctor --allreduce`'s trainer, and what ENTRYPOINT_PREFLIGHT_ALLREDUCE runs first.
ALLREDUCE = ("python", "-m", "entrypoint.job.allreduce")


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
    launcher: str
    command: tuple[str, ...]
    trainer: tuple[str, ...]
    env: Mapping[str, str | None]
    files: Mapping[str, str]
    sources: Mapping[str, str]
    ranks: tuple[int, int]  # first and last global rank on this node
    hosts: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    gpu_names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("env", "files", "sources"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = (dict(value) if isinstance(value, Mapping)
                           else list(value) if isinstance(value, tuple) else value)
        return out

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)


def _overlay(reading: Reading, settings: Settings) -> Reading:
    """Explicit settings beat the platform's values."""
    from dataclasses import replace

    changes: dict = {}
    for name in ("nnodes", "node_rank", "master_addr", "master_port"):
        value = getattr(settings, name)
        if value is not None:
            changes[name] = Sourced(value, f"env {PREFIX}{name.upper()}")
    return replace(reading, **changes) if changes else reading


def _visible_ids(env: Mapping[str, str], facts: Facts) -> tuple[list[str] | None, str]:
    """The GPU ids this node may use (as CUDA_VISIBLE_DEVICES spells them), when known."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() not in ("", "all"):
        ids = [x.strip() for x in cvd.split(",") if x.strip()]
        if ids and ids[0].startswith("-"):
            return [], "env CUDA_VISIBLE_DEVICES (hides every GPU)"
        if facts.gpus:  # probed: every listed GPU must exist here (seed 004's invalid ordinal)
            uuids = [g.uuid for g in facts.gpus if g.uuid]
            missing = [x for x in ids if not (
                (x.isdigit() and int(x) < len(facts.gpus))
                or (x.startswith(("GPU-", "MIG-")) and any(u.startswith(x) for u in uuids)))]
            if missing:
                n = len(facts.gpus)
                raise ConfigError(
                    "CUDA_VISIBLE_DEVICES", cvd,
                    f"names GPU {','.join(missing)} but this node has {n} ({facts.gpu_probe})",
                    f"List only this node's GPUs ({'0' if n == 1 else f'0-{n - 1}'}) or unset it: "
                    "a 2 x 8 job is not 1 x 16")
        return ids, "env CUDA_VISIBLE_DEVICES"
    if facts.gpus is None:
        return None, "not probed"
    ids = [str(gpu.index) for gpu in facts.gpus]
    nvd = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if nvd in ("void", "none"):
        return [], f"env NVIDIA_VISIBLE_DEVICES={nvd}"
    if nvd and nvd != "all":
        wanted = [x.strip() for x in nvd.split(",")]
        by_uuid = [str(g.index) for g in facts.gpus if g.uuid and g.uuid in wanted]
        if by_uuid:
            return by_uuid, f"{facts.gpu_probe}, restricted by NVIDIA_VISIBLE_DEVICES (UUIDs)"
        # Indices: the container runtime has already hidden the others from NVML.
    return ids, facts.gpu_probe


def _gpus(env, settings: Settings, reading: Reading, facts: Facts, sources: dict):
    visible, visible_from = _visible_ids(env, facts)
    if settings.gpus_per_node is not None:
        count = Sourced(settings.gpus_per_node, f"env {PREFIX}GPUS_PER_NODE")
    elif reading.gpus_per_node is not None:
        count = reading.gpus_per_node
    elif visible is not None:
        count = Sourced(len(visible), visible_from)
    else:
        count = Sourced(0, "default 0 (no GPU stated or probed)")
    sources["gpus_per_node"] = count.source
    if visible is None:
        visible = [str(i) for i in range(count.value)]
        visible_from = f"0..{count.value - 1} from the stated count" if count.value else visible_from
    elif len(visible) > count.value:
        visible = visible[: count.value]
    elif len(visible) < count.value and visible_from.startswith("env"):
        raise ConfigError(variable_of(count.source), count.value,
                          f"but {visible_from} leaves {len(visible)} GPUs visible",
                          "State the number of GPUs this node really has, or widen CUDA_VISIBLE_DEVICES")
    return count.value, visible, visible_from


def _device(settings: Settings, gpus: int, sources: dict) -> str:
    if settings.device == "cuda" and gpus == 0:
        raise ConfigError(f"{PREFIX}DEVICE", "cuda", "asks for GPUs but none is stated or visible",
                          "Start the container with --gpus all (or the NVIDIA runtime), or set "
                          f"{PREFIX}GPUS_PER_NODE")
    if settings.device != "auto":
        sources["device"] = f"env {PREFIX}DEVICE"
        return settings.device
    sources["device"] = "auto: GPUs present" if gpus else "auto: no GPU, workers run on CPU with gloo"
    return "cuda" if gpus else "cpu"


def _launcher(settings: Settings, spawn: bool, builtin_jax: bool, sources: dict) -> str:
    if settings.launcher == "auto" and builtin_jax:
        sources["launcher"] = f"the built-in JAX job ({PREFIX}JOB=jax)"
        return "jax"
    if settings.launcher != "auto":
        sources["launcher"] = f"env {PREFIX}LAUNCHER"
        if settings.launcher in ("torchrun", "accelerate") and not spawn:
            raise ConfigError(f"{PREFIX}LAUNCHER", settings.launcher,
                              "the platform already started one process per GPU, nothing to spawn",
                              f"Unset {PREFIX}LAUNCHER, or start one task per node")
        return settings.launcher
    sources["launcher"] = ("default: torchrun spawns the workers" if spawn
                           else "default: the platform started every process; exec directly")
    return "torchrun" if spawn else "direct"


def _nproc(settings, reading: Reading, launcher: str, device: str, gpus: int, sources) -> int:
    if launcher == "jax" and reading.spawn.value:
        if settings.nproc_per_node not in (None, 1):
            raise ConfigError(f"{PREFIX}NPROC_PER_NODE", settings.nproc_per_node,
                              "JAX runs one process per node that owns all its GPUs",
                              f"Unset {PREFIX}NPROC_PER_NODE for the jax launcher")
        sources["nproc_per_node"] = "jax: one process per node owns all the node's devices"
        return 1
    if settings.nproc_per_node is not None:
        count = Sourced(settings.nproc_per_node, f"env {PREFIX}NPROC_PER_NODE")
    elif reading.nproc_per_node is not None:
        count = reading.nproc_per_node
    elif device == "cuda":
        count = Sourced(gpus, f"one worker per GPU ({sources['gpus_per_node']})")
    else:
        count = Sourced(1, "default 1 on CPU")
    if device == "cuda" and count.value > gpus:
        raise ConfigError(variable_of(count.source), count.value,
                          f"asks for {count.value} GPU workers but this node has {gpus} GPUs "
                          f"({sources['gpus_per_node']})",
                          f"Ask for at most {gpus} workers per node, or run on nodes with more GPUs")
    sources["nproc_per_node"] = count.source
    return count.value


def _trainer(command: Sequence[str] | None, settings: Settings, sources: dict) -> tuple[str, ...]:
    if command:
        sources["trainer"] = "command line after --"
        return tuple(command)
    sources["trainer"] = f"the image's built-in {settings.job} job ({PREFIX}JOB)"
    return BUILTIN_JOBS[settings.job]


def _preflight(trainer: tuple[str, ...], settings: Settings, launcher: str,
               sources: dict) -> tuple[str, ...]:
    """ENTRYPOINT_PREFLIGHT_ALLREDUCE: each worker measures all-reduce bandwidth, then execs
    the trainer in the same process. Only torchrun's agent store outlives that measurement."""
    if not settings.preflight_allreduce or tuple(trainer[:3]) == ALLREDUCE:
        return trainer
    if launcher not in ("torchrun", "accelerate"):
        raise ConfigError(f"{PREFIX}PREFLIGHT_ALLREDUCE", "true",
                          "measures in the workers torchrun starts, then execs the trainer in "
                          f"them; the {launcher} launcher starts no torchrun",
                          "Unset it, and measure the nodes first with `entrypoint doctor "
                          "--allreduce`")
    sources["preflight_allreduce"] = (f"env {PREFIX}PREFLIGHT_ALLREDUCE: each worker measures "
                                      "all-reduce bandwidth, then execs the trainer")
    return (*ALLREDUCE, "--then", *trainer)


def _torchrun_args(trainer: Sequence[str], python: str) -> list[str]:
    """torchrun runs a script with its own Python: `python x.py` -> `x.py`, `python -m m` ->
    `--module m`; other interpreter options (`python -c CODE`, `python -u x.py`) keep the
    interpreter: `--no-python <python> -c CODE`."""
    head, rest = trainer[0], list(trainer[1:])
    if os.path.basename(head).startswith("python") and rest:
        if rest[0] == "-m":
            return ["--module", *rest[1:]]
        return ["--no-python", python, *rest] if rest[0].startswith("-") else rest
    if head.endswith(".py"):
        return list(trainer)
    return ["--no-python", *trainer]


def read_platform(env: Mapping[str, str]) -> tuple[str, str, Reading]:
    """(platform name, why it was chosen, its reading with explicit settings applied)."""
    module, why = platforms.detect(env)
    return module.NAME, why, _overlay(module.read(env), Settings.from_env(env))


def gpus_stated(env: Mapping[str, str], reading: Reading) -> bool:
    """Whether the plan can be made without probing GPUs."""
    settings = Settings.from_env(env)
    return (settings.gpus_per_node is not None or reading.gpus_per_node is not None
            or settings.device == "cpu")


def make_plan(env: Mapping[str, str], facts: Facts, command: Sequence[str] | None = None,
              read: tuple[str, str, Reading] | None = None) -> Plan:
    settings = Settings.from_env(env)
    platform_name, why, reading = read or read_platform(env)
    sources: dict[str, str] = {"platform": why}
    for key in ("nnodes", "node_rank", "master_port"):
        sources[key] = getattr(reading, key).source
    nnodes, node_rank = reading.nnodes.value, reading.node_rank.value
    below(variable_of(sources["node_rank"]), node_rank, variable_of(sources["nnodes"]), nnodes)
    notes, warnings = list(reading.notes), []

    master = reading.master_addr
    if master is None:
        if nnodes > 1:
            raise ConfigError("MASTER_ADDR", None, f"{nnodes} nodes but no master address",
                              "Set MASTER_ADDR (or ENTRYPOINT_MASTER_ADDR) on every node to node 0's host name or IP")
        master = Sourced("127.0.0.1", "default: single node, loopback")
    sources["master_addr"] = master.source

    gpus, visible, visible_from = _gpus(env, settings, reading, facts, sources)
    device = _device(settings, gpus, sources)
    spawn = reading.spawn.value
    sources["spawn"] = reading.spawn.source
    trainer = _trainer(command, settings, sources)
    launcher = _launcher(settings, spawn, trainer == BUILTIN_JOBS["jax"], sources)
    nproc = _nproc(settings, reading, launcher, device, gpus, sources)
    world = nnodes * nproc
    sources["world_size"] = f"nnodes {nnodes} x nproc_per_node {nproc}"
    if spawn:
        ranks = (node_rank * nproc, node_rank * nproc + nproc - 1)
        rank = local_rank = None
    else:
        rank, local_rank = reading.rank.value, reading.local_rank.value
        sources["rank"], sources["local_rank"] = reading.rank.source, reading.local_rank.source
        ranks = (rank, rank)

    cuda_visible = None
    if device == "cuda":
        chosen = visible if (launcher == "jax" or not spawn) else visible[:nproc]
        cuda_visible = ",".join(chosen)
        sources["cuda_visible_devices"] = visible_from

    # Config: the named one, else the one for the nearest world size (devices for JAX).
    devices = nnodes * (gpus if launcher == "jax" and device == "cuda" else nproc)
    config, sources["config"] = configs.select(settings.config, device=device, world_size=devices)
    needs_config = trainer in BUILTIN_JOBS.values() or launcher == "accelerate"
    run_dir = f"{settings.run_dir}/node{node_rank}"  # nodes sharing a host keep apart
    files: dict[str, str] = {}
    child: dict[str, str | None] = {}
    try:
        split = configs.split(config, devices)
    except ConfigError as err:
        if needs_config:
            raise
        split = None
        notes.append(f"config {config.name} does not fit; your trainer does not use it: "
                     f"{err.line()}")
    else:
        ds_path = f"{run_dir}/deepspeed.json"
        files[ds_path] = json.dumps(configs.derive_deepspeed(config, devices), indent=2) + "\n"
        child |= {"ENTRYPOINT_CONFIG_DIR": str(config.path), "ENTRYPOINT_DEEPSPEED_CONFIG": ds_path}
    if split is not None:
        sources["train_batch_size"] = split.why
        if split.global_batch != split.asked:
            (warnings if needs_config else notes).append(split.why)

    net_env, net_sources, net_warnings = network.settle(env, facts, settings, nnodes=nnodes,
                                                        device=device)
    child |= net_env
    sources |= net_sources
    warnings += net_warnings

    child |= {"MASTER_ADDR": master.value}
    port = reading.master_port.value
    if cuda_visible is not None:
        child["CUDA_VISIBLE_DEVICES"] = cuda_visible
    if device == "cpu":
        for key, value in (("DS_ACCELERATOR", "cpu"), ("JAX_PLATFORMS", "cpu"),
                           ("OMP_NUM_THREADS", str(max(1, facts.cpu_count // nproc)))):
            if key not in env:
                child[key] = value
    for key, value in (("XLA_PYTHON_CLIENT_PREALLOCATE", settings.xla_preallocate),
                       ("XLA_PYTHON_CLIENT_MEM_FRACTION", settings.xla_mem_fraction)):
        if value is not None:
            child[key] = str(value).lower() if isinstance(value, bool) else str(value)

    standalone = nnodes == 1 and settings.master_port is None and "MASTER_PORT" not in env
    launched = _preflight(trainer, settings, launcher, sources)
    if launcher == "torchrun":
        rendezvous = (["--standalone"] if standalone else
                      [f"--master-addr={master.value}", f"--master-port={port}"])
        if standalone:
            port, sources["master_port"] = None, "torchrun --standalone picks a free port"
        else:
            child["MASTER_PORT"] = str(port)
        # Restarts are the entrypoint's (all nodes together); torchrun keeps each rank's
        # stderr in logs/ (the failing rank's traceback is shown once, at node 0) and on screen.
        cmd = [facts.python, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
               f"--node-rank={node_rank}", f"--nproc-per-node={nproc}", *rendezvous,
               "--max-restarts=0", f"--log-dir={run_dir}/logs", "--redirects=2", "--tee=2",
               *_torchrun_args(launched, facts.python)]
    elif launcher == "accelerate":
        acc_path = f"{run_dir}/accelerate.yaml"
        files[acc_path] = _accelerate_yaml(config, nnodes, node_rank, world, master.value, port,
                                           files, run_dir)
        child |= {"MASTER_PORT": str(port), "ENTRYPOINT_ACCELERATE_CONFIG": acc_path}
        cmd = [facts.python, "-m", "accelerate.commands.launch", "--config_file", acc_path,
               *(_torchrun_args(launched, facts.python) if not launched[0].endswith(".py") else launched)]
    else:  # jax and direct: this process is the worker
        child["MASTER_PORT"] = str(port)
        place_rank = node_rank if spawn else rank
        place_local = 0 if spawn else local_rank
        child |= {"RANK": str(place_rank), "LOCAL_RANK": str(place_local),
                  "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(nproc),
                  "NODE_RANK": str(node_rank)}
        # jax.distributed.initialize() with no arguments: JAX reads JAX_COORDINATOR_ADDRESS and
        # JAX_LOCAL_DEVICE_IDS itself, and the count and id through jax_cluster's ClusterEnv,
        # which the site hook on PYTHONPATH registers (the ids also keep JAX's SLURM/Open MPI
        # readers from narrowing each process to GPU SLURM_LOCALID).
        host = f"[{master.value}]" if ":" in master.value else master.value
        child |= {"JAX_COORDINATOR_ADDRESS": f"{host}:{port}",
                  "JAX_NUM_PROCESSES": str(world), "JAX_PROCESS_ID": str(place_rank),
                  "PYTHONPATH": os.pathsep.join(
                      p for p in (str(jax_cluster.SITE_HOOK), env.get("PYTHONPATH")) if p)}
        sources["PYTHONPATH"] = ("the entrypoint's site hook first: jax.distributed.initialize() "
                                 "with no arguments reads the plan (entrypoint/jax_cluster.py)")
        if cuda_visible is not None:
            ids = range(gpus) if spawn else [local_rank]
            child["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(i) for i in ids)
            sources["JAX_LOCAL_DEVICE_IDS"] = ("every GPU of this node" if spawn
                                               else "this process's LOCAL_RANK")
        cmd = list(trainer)
        if cmd[0] == "python":
            cmd[0] = facts.python

    timeouts, timeout_warnings = _timeouts(env, settings, launcher, sources)
    child |= timeouts
    warnings += timeout_warnings
    if settings.control_port is not None:
        control_port, sources["control_port"] = settings.control_port, f"env {PREFIX}CONTROL_PORT"
    elif reading.master_port.value and not standalone:
        control_port = reading.master_port.value + 1
        sources["control_port"] = f"master port + 1 ({PREFIX}CONTROL_PORT unset)"
    else:
        control_port, sources["control_port"] = None, "single node: any free port on loopback"

    plan_args = dict(
        platform=platform_name, nnodes=nnodes, node_rank=node_rank, nproc_per_node=nproc,
        world_size=world, master_addr=master.value, master_port=port,
        control_port=control_port, spawn=spawn, rank=rank,
        local_rank=local_rank, device=device, gpus_per_node=gpus,
        cuda_visible_devices=cuda_visible, config=str(config.path),
        launcher=launcher, command=tuple(cmd), trainer=trainer, env=child, files=files,
        sources=sources, ranks=ranks, hosts=reading.hosts, notes=tuple(notes),
        warnings=tuple(warnings),
        gpu_names=tuple(g.name for g in facts.gpus or ()),
    )
    return Plan(**plan_args)


def _timeouts(env: Mapping[str, str], settings: Settings, launcher: str,
              sources: dict) -> tuple[dict[str, str], list[str]]:
    """One collective timeout for every library, so that a stuck rank surfaces in a known time
    and no library's own default (DeepSpeed 0.19: 10 min; accelerate: 30 min on gloo) comes back
    silently. Node loss does not wait for these: the entrypoints' heartbeats catch it."""
    seconds = settings.collective_timeout
    out = {"ENTRYPOINT_COLLECTIVE_TIMEOUT": str(seconds)}
    sources["ENTRYPOINT_COLLECTIVE_TIMEOUT"] = (f"env {PREFIX}COLLECTIVE_TIMEOUT"
                                                if "collective_timeout" in settings.model_fields_set
                                                else f"default {seconds} s")
    warnings = []
    if "DEEPSPEED_TIMEOUT" in env:
        sources["DEEPSPEED_TIMEOUT"] = "env DEEPSPEED_TIMEOUT (set by you, kept)"
    else:  # DeepSpeed reads it in minutes (deepspeed/constants.py default_pg_timeout)
        out["DEEPSPEED_TIMEOUT"] = str(-(-seconds // 60))
        sources["DEEPSPEED_TIMEOUT"] = f"{PREFIX}COLLECTIVE_TIMEOUT in minutes (DeepSpeed's own: 10)"
    if launcher == "accelerate":
        warnings.append("accelerate's process-group timeout is 1800 s on gloo (600 s on NCCL) "
                        "unless the trainer passes InitProcessGroupKwargs(timeout=...): read "
                        "ENTRYPOINT_COLLECTIVE_TIMEOUT from the environment there")
    return out, warnings


def _accelerate_yaml(config, nnodes, node_rank, world, master, port, files, run_dir) -> str:
    import yaml

    body = dict(config.accelerate)
    body["deepspeed_config"] = dict(body.get("deepspeed_config", {}),
                                    deepspeed_config_file=f"{run_dir}/deepspeed.json")
    body |= {"num_machines": nnodes, "machine_rank": node_rank, "num_processes": world,
             "main_process_ip": master, "main_process_port": port, "rdzv_backend": "static"}
    return "# Written by the entrypoint for this node; do not edit.\n" + yaml.safe_dump(body, sort_keys=True)
