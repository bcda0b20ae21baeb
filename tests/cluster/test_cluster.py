"""Two node containers on a private network, each started with one platform's real variables
and nothing else (plus the job's length and, where the platform has no such variable, 2 CPU
workers per node). What is checked is what the workers themselves wrote in
<output>/results/rank<R>.json: world size, rank, node, falling loss, one checkpoint writer,
and both containers' exit codes.

Each platform's variable set is the one its unit test cites (tests/unit/test_platforms_*.py)
and docs/platforms.md's table lists. The conventions are used here by the other container tests
(tests/compat runs torch DDP and JAX under each); the built-in JAX job runs once here, under a
container platform's variables: where each convention puts a rank is the launch's, not the
job's, and tests/compat/test_compat.py checks it under every convention. The built-in DeepSpeed
job's same checks across two containers are tests/cluster/test_local.py's
`test_two_nodes_train_together` (`entrypoint local`, hand-started nodes).
"""

from __future__ import annotations

import pytest

from entrypoint.local.cluster import Cluster, Node

STEPS = 40  # enough for the loss to fall clearly (~4.3 -> ~1.9), a few seconds of training
TIMEOUT = 240  # per cluster; a run takes ~30-60 s on 2 cores, more while others build
TWO_WORKERS = {"ENTRYPOINT_NPROC_PER_NODE": "2"}  # CPU nodes: the default would be 1 worker


def commercial(c: Cluster) -> list[Node]:
    """Container platforms with one container per node (seed 002: WORLD_SIZE=2, RANK=0|1,
    MASTER_ADDR=jo-...-worker-0, MASTER_PORT=29500); tests/unit/test_platforms_commercial.py."""
    master = c.hostname("worker", 0)
    return [
        Node(
            c.hostname("worker", r),
            {"WORLD_SIZE": "2", "RANK": str(r), "MASTER_ADDR": master, "MASTER_PORT": "29500"}
            | TWO_WORKERS,
        )
        for r in (0, 1)
    ]


def torchrun(c: Cluster) -> list[Node]:
    """Nodes started by hand with torchrun's names (seeds 001, 003, 004; torchrun's flags,
    https://pytorch.org/docs/stable/elastic/run.html); tests/unit/test_platforms_torchrun.py."""
    master = c.hostname("node", 0)
    return [
        Node(
            c.hostname("node", r),
            {"NNODES": "2", "NODE_RANK": str(r), "MASTER_ADDR": master, "MASTER_PORT": "29500"}
            | TWO_WORKERS,
        )
        for r in (0, 1)
    ]


def slurm(c: Cluster) -> list[Node]:
    """`sbatch -N2 --ntasks-per-node=1` then `srun entrypoint run`: what srun sets in each task
    (https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES), without the
    GPU variables of a CPU node; tests/unit/test_platforms_slurm.py (ONE_TASK_PER_NODE).
    No MASTER_PORT: the entrypoint derives it from the job id, as on a real cluster."""
    hostlist = f"{c.prefix}-node-[0-1]"  # expands to the two container names
    job = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOBID": "4242",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_NODELIST": hostlist,
        "SLURM_NODELIST": hostlist,
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_STEP_NODELIST": hostlist,
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_NTASKS": "2",
        "SLURM_NPROCS": "2",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_LOCALID": "0",
        "SLURM_CPUS_ON_NODE": "2",
    }
    return [
        Node(
            c.hostname("node", r),
            job
            | TWO_WORKERS
            | {
                "SLURM_NODEID": str(r),
                "SLURM_PROCID": str(r),
                "SLURMD_NODENAME": c.hostname("node", r),
            },
        )
        for r in (0, 1)
    ]


def pytorchjob(c: Cluster) -> list[Node]:
    """Kubeflow training-operator v1.7+ PyTorchJob, Master x1 + Worker x1, nprocPerNode "2": what
    setPodEnv puts in each pod (pkg/controller.v1/pytorch/envvar.go; port 23456 =
    PyTorchJobDefaultPort); tests/unit/test_platforms_pytorchjob.py. The pods are <job>-master-0
    and <job>-worker-0. No ENTRYPOINT_NPROC_PER_NODE: PET_NPROC_PER_NODE says 2."""
    master = c.hostname("master", 0)
    common = {
        "PYTHONUNBUFFERED": "1",
        "MASTER_ADDR": master,
        "MASTER_PORT": "23456",
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": "23456",
        "WORLD_SIZE": "4",
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "2",
    }
    return [
        Node(name, common | {"RANK": str(r), "PET_NODE_RANK": str(r)})
        for r, name in enumerate((master, c.hostname("worker", 0)))
    ]


STYLES = {"commercial": commercial, "torchrun": torchrun, "slurm": slurm, "pytorchjob": pytorchjob}


def with_job(nodes: list[Node], **env: str) -> list[Node]:
    return [Node(n.name, dict(n.env) | env, n.delay) for n in nodes]


def assert_trained(run, nodes: list[Node], *, job: str, per_node: int) -> None:
    """Every worker reported the right place in a world of len(nodes) x per_node, the loss fell,
    exactly one (rank 0) wrote the checkpoint, and every container exited 0."""
    run.check()
    world = len(nodes) * per_node
    got = run.results
    assert [r["rank"] for r in got] == list(range(world)), run.log(60)
    for node_index, (node, node_run) in enumerate(zip(nodes, run.nodes, strict=True)):
        ranks = list(range(node_index * per_node, (node_index + 1) * per_node))
        assert sorted(r["rank"] for r in node_run.results) == ranks, (node.name, node_run.results)
        for r in node_run.results:
            assert r["job"] == job and r["world_size"] == world, r
            assert r["node_rank"] == node_index and r["node"] == node.name, r
            assert r["local_rank"] == r["rank"] - node_index * per_node, r
            assert r["steps"] == STEPS and r["resumed_from"] is None, r
            assert r["final_loss"] < r["first_loss"] - 1.0, r  # from ~4.3 (guessing is 4.16)
    writers = [r["rank"] for r in got if r["checkpoint_writer"]]
    assert writers == [0], f"checkpoint writers: {writers}"


@pytest.mark.parametrize("style", ["commercial"])
def test_jax(image, docker_client, style):
    """One JAX process per node owns the node's devices: JAX counts processes, so world size 2."""
    with Cluster(image, client=docker_client, echo=print) as c:
        nodes = [
            Node(n.name, {k: v for k, v in n.env.items() if k not in TWO_WORKERS})
            for n in STYLES[style](c)
        ]
        nodes = with_job(nodes, ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS=str(STEPS))
        run = c.run(nodes, timeout=TIMEOUT)
        assert_trained(run, nodes, job="jax", per_node=1)
        print(f"jax {style}: {run.seconds:.1f} s")
