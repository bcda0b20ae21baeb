"""Render a spec, give each node the environment its platform would give it from that spec, plan,
and compare with what was asked. Each `*_nodes` function plays the platform's part, reading the
rendered text (not the request), after the source named in its docstring.
"""

import itertools
import shlex

import pytest
import yaml

from conftest import node
from entrypoint.plan.node_plan import make_plan
from entrypoint.render import render
from entrypoint.render.request import build

IMAGE = "ghcr.io/example/multinode:1.0"

# (nodes, GPUs per node, --master-port, trainer): shapes with and without GPUs, a port, a
# command, and the built-in job (which needs a shipped config: 1 x CPU, 2 x 8 = 16 GPUs).
SHAPES = [
    (2, 8, None, ["python", "train.py", "--epochs", "3"]),
    (3, 4, "29400", ["python", "-m", "pkg.train", "--lr", "1e-4"]),
    (1, 0, None, []),
    (2, 8, None, []),
]


def _literal_env(container: dict) -> dict[str, str]:
    """The container's env entries with a value; secretKeyRef ones stand for a Secret."""
    return {e["name"]: e.get("value", "<from secret>") for e in container.get("env", [])}


def _command(args: list[str]) -> list[str]:
    assert args[0] == "run", args
    return args[2:] if args[1:2] == ["--"] else []


def _gpus(resources: dict | None) -> int:
    return int(((resources or {}).get("limits") or {}).get("nvidia.com/gpu", 0))


def kubernetes_nodes(text: str):
    """Indexed Job: the Job controller adds JOB_COMPLETION_INDEX=i to pod i and names its host
    <job>-<i>; with subdomain set to a headless Service selecting the pods, pod 0 is
    <job>-0.<subdomain> (https://kubernetes.io/docs/concepts/workloads/controllers/job/
    #completion-mode, https://kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication/)."""
    service, job = yaml.safe_load_all(text)
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["metadata"]["name"] == pod["subdomain"]
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    (container,) = pod["containers"]
    master = f"{job['metadata']['name']}-0.{pod['subdomain']}"
    envs = [
        _literal_env(container)
        | {"JOB_COMPLETION_INDEX": str(i), "HOSTNAME": f"{job['metadata']['name']}-{i}"}
        for i in range(spec["completions"])
    ]
    port = int(_literal_env(container).get("MASTER_PORT", 29500))  # torchrun's default
    return envs, _gpus(container.get("resources")), _command(container["args"]), master, port


def pytorchjob_nodes(text: str):
    """training-operator v1.9.0 setPodEnv (pkg/controller.v1/pytorch/envvar.go, master.go):
    every container gets PYTHONUNBUFFERED, MASTER_ADDR=<job>-master-0, MASTER_PORT (port
    pytorchjob-port of the Master's `pytorch` container, else 23456), WORLD_SIZE = pods x
    getNprocPerNodeInt, RANK = PET_NODE_RANK = index (worker i -> i + 1), PET_NPROC_PER_NODE =
    nprocPerNode, PET_NNODES = pods, and PET_MASTER_ADDR/PORT."""
    (job,) = yaml.safe_load_all(text)
    name, spec = job["metadata"]["name"], job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    pods = sum(r["replicas"] for r in replicas.values())
    nproc = spec.get("nprocPerNode")
    nproc_int = int(nproc) if nproc and nproc.isdigit() else 1
    (master_container,) = replicas["Master"]["template"]["spec"]["containers"]
    assert master_container["name"] == "pytorch"
    port = next(
        (
            p["containerPort"]
            for p in master_container.get("ports", [])
            if p["name"] == "pytorchjob-port"
        ),
        23456,
    )
    envs = []
    for rtype, offset in (("Master", 0), ("Worker", 1)):
        if rtype not in replicas:
            continue
        (container,) = replicas[rtype]["template"]["spec"]["containers"]
        for index in range(replicas[rtype]["replicas"]):
            rank = str(index + offset)
            env = _literal_env(container) | {
                "PYTHONUNBUFFERED": "1",
                "MASTER_ADDR": f"{name}-master-0",
                "MASTER_PORT": str(port),
                "PET_MASTER_ADDR": f"{name}-master-0",
                "PET_MASTER_PORT": str(port),
                "WORLD_SIZE": str(pods * nproc_int),
                "RANK": rank,
                "PET_NODE_RANK": rank,
                "PET_NNODES": str(pods),
            }
            if nproc is not None:
                env["PET_NPROC_PER_NODE"] = nproc
            envs.append(env)
    return (
        envs,
        _gpus(master_container.get("resources")),
        _command(master_container["args"]),
        f"{name}-master-0",
        port,
    )


def trainjob_nodes(text: str):
    """Kubeflow Trainer v2.3.0 Torch plugin (pkg/runtime/framework/plugins/torch/torch.go,
    pkg/constants): in the `node` container PET_NNODES = numNodes, PET_NPROC_PER_NODE =
    numProcPerNode ("auto" unless given), PET_NODE_RANK = the completion index,
    PET_MASTER_ADDR=<job>-node-0-0.<job>, PET_MASTER_PORT=29500; the Job controller adds
    JOB_COMPLETION_INDEX; trainer.env is merged in."""
    (job,) = yaml.safe_load_all(text)
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    master = f"{name}-node-0-0.{name}"
    envs = [
        _literal_env(trainer)
        | {
            "PET_NNODES": str(trainer["numNodes"]),
            "PET_NPROC_PER_NODE": str(trainer.get("numProcPerNode", "auto")),
            "PET_NODE_RANK": str(i),
            "JOB_COMPLETION_INDEX": str(i),
            "PET_MASTER_ADDR": master,
            "PET_MASTER_PORT": "29500",
        }
        for i in range(trainer["numNodes"])
    ]
    return envs, _gpus(trainer.get("resourcesPerNode")), _command(trainer["args"]), master, 29500


def volcano_nodes(text: str):
    """Volcano v1.15 job plugins (pkg/controllers/job/plugins): pytorch sets MASTER_ADDR =
    <job>-<master task>-0.<job>, MASTER_PORT (--port, default 23456), WORLD_SIZE = master +
    worker replicas, RANK (master 0, worker i -> i + 1); svc sets VC_<TASK>_HOSTS and
    VC_<TASK>_NUM for every task; env sets VK_TASK_INDEX and VC_TASK_INDEX."""
    (job,) = yaml.safe_load_all(text)
    name, spec = job["metadata"]["name"], job["spec"]
    flags = dict(arg.lstrip("-").split("=", 1) for arg in spec["plugins"]["pytorch"])
    assert {"svc", "env"} <= spec["plugins"].keys()
    master_task, worker_task = flags.get("master", "master"), flags.get("worker", "worker")
    port = int(flags.get("port", 23456))
    tasks = {t["name"]: t for t in spec["tasks"]}
    world = sum(t["replicas"] for n, t in tasks.items() if n in (master_task, worker_task))
    svc = {}
    for task in spec["tasks"]:
        key = task["name"].upper().replace("-", "_")
        svc[f"VC_{key}_HOSTS"] = ",".join(
            f"{name}-{task['name']}-{i}.{name}" for i in range(task["replicas"])
        )
        svc[f"VC_{key}_NUM"] = str(task["replicas"])
    envs = []
    for task_name, offset in ((master_task, 0), (worker_task, 1)):
        if task_name not in tasks:
            continue
        (container,) = tasks[task_name]["template"]["spec"]["containers"]
        for index in range(tasks[task_name]["replicas"]):
            envs.append(
                _literal_env(container)
                | svc
                | {
                    "MASTER_ADDR": f"{name}-{master_task}-0.{name}",
                    "MASTER_PORT": str(port),
                    "WORLD_SIZE": str(world),
                    "RANK": str(index + offset),
                    "VK_TASK_INDEX": str(index),
                    "VC_TASK_INDEX": str(index),
                }
            )
    (container,) = tasks[master_task]["template"]["spec"]["containers"]
    return (
        envs,
        _gpus(container.get("resources")),
        _command(container["args"]),
        f"{name}-{master_task}-0.{name}",
        port,
    )


def _shell_commands(text: str, first_word: str) -> list[list[str]]:
    """Each command starting with first_word, its continuation lines joined, as argv."""
    joined = text.replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.startswith(first_word)]


def slurm_nodes(text: str):
    """sbatch -N<n> --ntasks-per-node=1 --gres=gpu:<g>, then srun: what srun sets in the task on
    node i (https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES; the same
    shape as tests/unit/test_platforms_slurm.py), plus the script's exports."""
    directives = dict(
        line.removeprefix("#SBATCH --").split("=", 1)
        for line in text.splitlines()
        if line.startswith("#SBATCH --") and "=" in line
    )
    assert directives["ntasks-per-node"] == "1" and "#SBATCH --exclusive" in text
    nodes = int(directives["nodes"])
    gpus = int(directives["gres"].removeprefix("gpu:")) if "gres" in directives else 0
    exports = dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1)
        for line in text.splitlines()
        if line.startswith("export ")
    )
    (srun,) = _shell_commands(text, "srun ")
    assert "--ntasks-per-node=1" in srun
    at = srun.index("entrypoint")
    hosts = f"node[0-{nodes - 1}]" if nodes > 1 else "node0"
    envs = []
    for i in range(nodes):
        env = exports | {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": directives["job-name"],
            "SLURM_JOB_NODELIST": hosts,
            "SLURM_NNODES": str(nodes),
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NODELIST": hosts,
            "SLURM_STEP_NUM_NODES": str(nodes),
            "SLURM_STEP_NUM_TASKS": str(nodes),
            "SLURM_STEP_TASKS_PER_NODE": f"1(x{nodes})",
            "SLURM_NTASKS": str(nodes),
            "SLURM_TASKS_PER_NODE": f"1(x{nodes})",
            "SLURM_NODEID": str(i),
            "SLURM_PROCID": str(i),
            "SLURM_LOCALID": "0",
        }
        if gpus:
            env |= {
                "SLURM_GPUS_ON_NODE": str(gpus),
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus))),
            }
        envs.append(env)
    port = int(exports.get("MASTER_PORT", 15000 + 4242 % 20000))  # slurm.py derives it
    return envs, gpus, _command(srun[at + 1 :]), "node0", port


def docker_nodes(text: str):
    """Hand-started machines: each `docker run` gives its container the -e values (`-e NAME`
    alone copies the caller's, here a secret); https://docs.docker.com/reference/cli/docker/
    container/run/#env."""
    commands = _shell_commands(text, "docker run ")
    envs = []
    for argv in commands:
        assert {"--network", "--ipc"} <= set(argv) and argv[argv.index("--network") + 1] == "host"
        env = {}
        for flag, value in itertools.pairwise(argv):
            if flag == "-e":
                key, _, val = value.partition("=")
                env[key] = val if "=" in value else "<from the shell>"
        envs.append(env)
    image_at = next(i for i, word in enumerate(argv) if word.startswith("ghcr.io/"))
    gpus = int(envs[0].get("GPUS_PER_NODE", 0))
    assert ("--gpus" in argv) == bool(gpus)
    return (
        envs,
        gpus,
        _command(argv[image_at + 1 :]),
        envs[0]["MASTER_ADDR"],
        int(envs[0]["MASTER_PORT"]),
    )


PLATFORMS = {
    "kubernetes": kubernetes_nodes,
    "pytorchjob": pytorchjob_nodes,
    "trainjob": trainjob_nodes,
    "volcano": volcano_nodes,
    "slurm-pyxis": slurm_nodes,
    "slurm-apptainer": slurm_nodes,
    "slurm-none": slurm_nodes,
    "docker": docker_nodes,
}
# The port each platform uses when none is asked for.
DEFAULT_PORT = {
    "kubernetes": 29500,
    "pytorchjob": 23456,
    "trainjob": 29500,
    "volcano": 23456,
    "slurm": 15000 + 4242 % 20000,
    "docker": 29500,
}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}-{s[2]}-{len(s[3])}")
@pytest.mark.parametrize("target", sorted(PLATFORMS))
def test_the_plan_reads_what_was_rendered(target, shape):
    nodes, gpus, port, command = shape
    platform, _, runtime = target.partition("-")
    if platform == "trainjob" and port:
        port = None  # the Trainer fixes it at 29500; render takes no --master-port there
    request = build(
        platform,
        nodes=str(nodes),
        gpus_per_node=str(gpus),
        image=IMAGE,
        name="llm",
        trainer=["--", *command] if command else [],
        master_port=port,
        master_addr="10.0.0.1" if platform == "docker" else None,
        runtime=runtime or None,
        env=["NCCL_DEBUG=INFO", "HF_TOKEN"],
    )
    envs, stated_gpus, trainer, master, platform_port = PLATFORMS[target](render(request))

    assert len(envs) == nodes and stated_gpus == gpus and trainer == command
    assert platform_port == (int(port) if port else DEFAULT_PORT[platform])
    nproc = max(gpus, 1)
    for rank, env in enumerate(envs):
        plan = make_plan(env, node(gpus), trainer or None)
        assert plan.platform == {
            "slurm": "slurm",
            "docker": "torchrun",
            "kubernetes": "indexedjob",
        }.get(platform, platform)
        assert (plan.nnodes, plan.node_rank, plan.nproc_per_node, plan.world_size) == (
            nodes,
            rank,
            nproc,
            nodes * nproc,
        )
        assert plan.master_addr == master
        assert env["NCCL_DEBUG"] == "INFO" and plan.device == ("cuda" if gpus else "cpu")
        # One node with no MASTER_PORT in its environment: torchrun --standalone picks a port.
        standalone = nodes == 1 and "MASTER_PORT" not in env
        assert plan.master_port == (None if standalone else platform_port)


@pytest.mark.parametrize("address", ["fd00::2", "[fd00::2]", "fe80::1%eth0"])
def test_an_ipv6_machine_0_reaches_every_node_s_plan_bare(address):
    request = build(
        "docker",
        nodes="2",
        gpus_per_node="8",
        image=IMAGE,
        master_addr=address,
        master_port="29400",
    )
    envs, _, _, master, _ = docker_nodes(render(request))
    bare = address.strip("[]")
    assert master == bare
    for rank, env in enumerate(envs):
        plan = make_plan(env | {"ENTRYPOINT_LAUNCHER": "jax"}, node(8), ["python", "t.py"])
        assert plan.master_addr == bare and plan.node_rank == rank
        assert plan.env["JAX_COORDINATOR_ADDRESS"] == f"[{bare}]:29400"
