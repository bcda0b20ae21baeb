"""`entrypoint local` without Docker: what each node container gets, and bad input refused
before any engine is asked (the real run is tests/cluster/test_local.py)."""

import os
import subprocess
import sys

import pytest

from entrypoint.local.local_job import ClusterLayout, layout, nodes
from entrypoint.plan.errors import ConfigError

NONE = "probe: no NVIDIA driver found"


@pytest.mark.parametrize(
    ("ask", "host", "want"),
    [
        # (nnodes, gpus_per_node, workers, job), GPUs on this machine -> (G, workers, per-node ids)
        ((2, None, None, "deepspeed"), 0, (0, 2, ((), ()))),
        ((2, 0, 3, "deepspeed"), 8, (0, 3, ((), ()))),
        ((2, None, None, "deepspeed"), 8, (4, None, (("0", "1", "2", "3"), ("4", "5", "6", "7")))),
        ((2, 2, None, "deepspeed"), 8, (2, None, (("0", "1"), ("2", "3")))),
        ((3, 1, None, "deepspeed"), 3, (1, None, (("0",), ("1",), ("2",)))),
        ((2, None, None, "deepspeed"), 1, (0, 2, ((), ()))),  # 1 GPU for 2 nodes: CPU
        ((2, None, None, "jax"), 0, (0, None, ((), ()))),  # JAX: one process per node
        ((1, None, None, "deepspeed"), 2, (2, None, (("0", "1"),))),
    ],
)
def test_layout_splits_this_machines_gpus(ask, host, want):
    nnodes, gpus_per_node, workers, job = ask
    got = layout(
        nnodes=nnodes,
        gpus_per_node=gpus_per_node,
        workers=workers,
        job=job,
        host_gpus=host,
        gpu_probe="probe nvml",
    )
    assert (got.gpus_per_node, got.workers, got.gpu_ids) == want


@pytest.mark.parametrize(
    ("ask", "host", "start"),
    [
        ((0, None, None, "deepspeed"), 0, "--nodes='0': must be 1 or more"),
        ((-1, None, None, "deepspeed"), 0, "--nodes='-1': must be 1 or more"),
        (
            (2, 1, None, "deepspeed"),
            0,
            "--gpus-per-node='1': 2 nodes x 1 GPUs need 2 but this machine has 0",
        ),
        (
            (2, 4, None, "deepspeed"),
            7,
            "--gpus-per-node='4': 2 nodes x 4 GPUs need 8 but this machine has 7",
        ),
        ((2, -1, None, "deepspeed"), 0, "--gpus-per-node='-1': must be 0 or more"),
        ((2, 0, 0, "deepspeed"), 0, "--workers='0': must be 1 or more"),
        ((2, 0, 2, "jax"), 0, "--workers='2': the JAX job runs one process per node"),
        ((10**30, None, None, "deepspeed"), 0, f"--nodes='{10**30}': is above 64"),
        ((65, 0, None, "deepspeed"), 0, "--nodes='65': is above 64"),
        ((2, 257, None, "deepspeed"), 0, "--gpus-per-node='257': is above 256"),
        ((2, 0, 1025, "deepspeed"), 0, "--workers='1025': is above 1024"),
    ],
)
def test_layout_refuses(ask, host, start):
    nnodes, gpus_per_node, workers, job = ask
    with pytest.raises(ConfigError) as err:
        layout(
            nnodes=nnodes,
            gpus_per_node=gpus_per_node,
            workers=workers,
            job=job,
            host_gpus=host,
            gpu_probe="probe nvml",
        )
    assert err.value.line().startswith(start)


def test_nodes_are_hand_started_nodes_with_their_own_gpus():
    plan = layout(
        nnodes=2,
        gpus_per_node=2,
        workers=None,
        job="deepspeed",
        host_gpus=4,
        gpu_probe="probe nvml",
    )
    a, b = nodes(
        plan,
        lambda r: f"x-node-{r}",
        env={"ENTRYPOINT_JOB_STEPS": "40"},
        command=["python", "train.py"],
    )
    assert (a.name, b.name) == ("x-node-0", "x-node-1")
    for rank, node in enumerate((a, b)):
        assert {
            k: node.env[k]
            for k in (
                "NNODES",
                "NODE_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
                "GPUS_PER_NODE",
                "ENTRYPOINT_JOB_STEPS",
            )
        } == {
            "NNODES": "2",
            "NODE_RANK": str(rank),
            "MASTER_ADDR": "x-node-0",
            "MASTER_PORT": "29500",
            "GPUS_PER_NODE": "2",
            "ENTRYPOINT_JOB_STEPS": "40",
        }
        assert "ENTRYPOINT_NPROC_PER_NODE" not in node.env  # one worker per GPU, the default
        assert node.env["NVIDIA_VISIBLE_DEVICES"] == ("0,1", "2,3")[rank]
        assert node.command == ("run", "--", "python", "train.py")
    assert (tuple(a.gpus), tuple(b.gpus)) == (("0", "1"), ("2", "3"))


def test_nodes_share_a_job_name_and_a_fresh_token():
    """`entrypoint local` generates the job's token: nodes of another run are refused."""
    plan = ClusterLayout(2, 0, 2, "deepspeed", ((), ()), "no GPU here")
    a, b = nodes(plan, lambda r: f"n{r}", token="f" * 64)
    assert a.env["ENTRYPOINT_JOB_ID"] == b.env["ENTRYPOINT_JOB_ID"] == "n0"
    assert a.env["ENTRYPOINT_JOB_TOKEN"] == b.env["ENTRYPOINT_JOB_TOKEN"] == "f" * 64
    assert "ENTRYPOINT_JOB_TOKEN" not in nodes(plan, lambda r: f"n{r}")[0].env


def test_cpu_nodes_get_workers_and_the_users_env_wins():
    plan = ClusterLayout(2, 0, 2, "deepspeed", ((), ()), "no GPU here")
    a, b = nodes(plan, lambda r: f"n{r}", env={"ENTRYPOINT_NPROC_PER_NODE": "1"})
    assert a.env["ENTRYPOINT_NPROC_PER_NODE"] == "1" and a.command is None and not a.gpus
    assert (a.env["ENTRYPOINT_GPUS_PER_NODE"], a.env["NVIDIA_VISIBLE_DEVICES"]) == ("0", "void")
    assert "GPUS_PER_NODE" not in a.env  # the torchrun platform's must be positive
    assert nodes(plan, lambda r: f"n{r}")[1].env["ENTRYPOINT_NPROC_PER_NODE"] == "2"


BAD_DOCKER = {
    "PATH": os.environ["PATH"],
    "HOME": os.environ.get("HOME", "/tmp"),
    "DOCKER_HOST": "unix:///nonexistent/docker.sock",
}  # proves no engine was asked


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["--nodes", "0"], "entrypoint: error: --nodes='0': not a whole number from 1 to 64."),
        (["--nodes", "²"], "entrypoint: error: --nodes='²': not a whole number from 1 to 64."),
        (
            ["--nodes", str(10**30)],
            f"entrypoint: error: --nodes='{10**30}': not a whole number from 1 to 64.",
        ),
        (
            ["--nodes", "2", "--workers", "x"],
            "entrypoint: error: --workers='x': not a whole number from 1 to 1024.",
        ),
        (
            ["--nodes", "2", "--gpus-per-node", "200"],
            "entrypoint: error: --gpus-per-node='200': 2 nodes x 200 GPUs need 400 "
            "but this machine has",
        ),
        (
            ["--nodes", "2", "-e", "NOEQUALS"],
            "entrypoint: error: --env='NOEQUALS': is not VAR=VALUE.",
        ),
    ],
)
def test_cli_bad_input_one_line_exit_2_before_docker(args, start):
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", "local", *args],
        capture_output=True,
        text=True,
        env=BAD_DOCKER,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert out.stderr.startswith(start) and out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_cli_no_engine_is_one_line():
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", "local", "--nodes", "2", "--gpus-per-node", "0"],
        capture_output=True,
        text=True,
        env=BAD_DOCKER,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert out.stderr.startswith(
        "entrypoint: error: DOCKER_HOST='unix:///nonexistent/docker.sock': no Docker engine answers"
    ), out.stderr
    assert out.stderr.count("\n") == 1


def test_missing_sdk_is_one_line(tmp_path):
    """Without the `local` extra: the one-line error of entrypoint.local.cluster.sdk()."""
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "__init__.py").write_text("raise ImportError('no docker here')\n")
    env = BAD_DOCKER | {"PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", "local", "--nodes", "2", "--gpus-per-node", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert out.stderr.startswith(
        "entrypoint: error: docker=(unset): the Docker SDK for Python is not installed. pip install"
    ), out.stderr


def test_gpu_nodes_become_device_requests_with_explicit_ids():
    """What Docker is asked for (no engine: a client that records the call)."""
    from entrypoint.local.cluster import Cluster

    class Containers:
        def create(self, image, **kwargs):
            self.kwargs = kwargs

    client = type("Client", (), {"containers": Containers()})()
    cluster = Cluster("img", prefix="x", client=client)
    plan = layout(
        nnodes=2,
        gpus_per_node=2,
        workers=None,
        job="deepspeed",
        host_gpus=4,
        gpu_probe="probe nvml",
    )
    second = nodes(plan, lambda r: f"x-node-{r}")[1]
    cluster._create(second)
    (request,) = client.containers.kwargs["device_requests"]
    assert (request.device_ids, request.capabilities, request.count) == (["2", "3"], [["gpu"]], 0)
    cluster._create(
        nodes(
            layout(
                nnodes=2,
                gpus_per_node=0,
                workers=None,
                job="deepspeed",
                host_gpus=4,
                gpu_probe="probe nvml",
            ),
            lambda r: f"x{r}",
        )[0]
    )
    assert client.containers.kwargs["device_requests"] is None


def test_spares_are_containers_beside_the_nodes_each_with_its_share_of_gpus():
    got = layout(
        nnodes=2, gpus_per_node=None, workers=None, job="deepspeed", host_gpus=6,
        gpu_probe="probe nvml", spares=1, min_nodes=1,
    )  # fmt: skip
    assert (got.nnodes, got.training, got.spares, got.gpus_per_node) == (3, 2, 1, 2)
    assert got.gpu_ids == (("0", "1"), ("2", "3"), ("4", "5"))
    specs = nodes(got, lambda rank: f"n{rank}")
    assert [s.env["NNODES"] for s in specs] == ["3"] * 3  # the platform counts the spares
    assert {s.env["ENTRYPOINT_SPARES"] for s in specs} == {"1"}
    assert {s.env["ENTRYPOINT_MIN_NODES"] for s in specs} == {"1"}


@pytest.mark.parametrize(
    "spares, least, option", [(-1, None, "--spares"), (63, None, "--spares"), (0, 3, "--min-nodes")]
)
def test_spare_options_out_of_range_are_refused(spares, least, option):
    with pytest.raises(ConfigError) as err:
        layout(
            nnodes=2, gpus_per_node=0, workers=None, job="deepspeed", host_gpus=0,
            gpu_probe=NONE, spares=spares, min_nodes=least,
        )  # fmt: skip
    assert err.value.variable == option


@pytest.mark.parametrize(
    ("lost", "said"),
    [
        (
            {"local-9780-node-1": 137},
            "node local-9780-node-1 (exit 137: SIGKILL) was lost on the way; the job went on "
            "without it",
        ),
        (
            {"local-9780-node-2": 75, "local-9780-node-1": 143},
            "nodes local-9780-node-1 (exit 143: SIGTERM) and local-9780-node-2 (exit 75) were "
            "lost on the way; the job went on without them",
        ),
    ],
)
def test_nodes_lost_on_the_way_are_said_in_a_sentence(lost, said):
    """`local --spares 1 --kill 1@30` ended with `local: lost {'local-9780-node-1': 137} on the
    way`, a raw dict (issue 52)."""
    from entrypoint.local.demo import lost_on_the_way

    assert lost_on_the_way(lost) == said


def test_node_0_can_be_killed_only_where_the_job_outlives_it():
    from entrypoint.local.demo import Kill, parse_kills
    from entrypoint.plan.errors import ConfigError

    assert parse_kills(["0@30", "1@10"], 3, node0=True) == [Kill(1, 10), Kill(0, 30)]
    with pytest.raises(ConfigError, match="names node 0, whose loss ends this job") as refused:
        parse_kills(["0@30"], 2)
    assert "--nodes 2 --spares 1" in str(refused.value)
    with pytest.raises(ConfigError, match=r"names no node of this job \(0-2\)"):
        parse_kills(["3@30"], 3, node0=True)


def test_the_story_of_a_lost_node_0_is_told_from_the_new_node_0s_lines():
    from entrypoint.local.cluster import ClusterRun, NodeRun
    from entrypoint.local.demo import Killed, head, story

    names = ["n-0", "n-1", "n-2"]
    runs = [
        NodeRun("n-0", 137, ["[job] step 30/100 loss 1.0"], times=[10.0]),
        NodeRun(
            "n-1",
            0,
            [
                "node 0 (n-0) lost; node 1 (n-1) is node 0 from restart 1",
                "restart 1: node 1 moves from node rank 1 to 0; node 2 takes node rank 1",
                "[job] resuming from checkpoint /shared/job/ckpt (step 25)",
                "[job] step 30/100 loss 0.9",
                "[job] step 100/100 loss 0.1",
            ],
            times=[16.0, 17.0, 19.0, 20.5, 40.0],
        ),
        NodeRun(
            "n-2", 0, ["node 0 (n-0) lost; node 1 (n-1) is node 0 from restart 1"], times=[16.1]
        ),
    ]
    run = ClusterRun(runs, [], 41.0, False, [])
    assert story(run, [Killed(0, "n-0", 30, 11.0)], names) == [
        "local: node 0 lost at step 30 (killed, 11.0 s in); node 1 is node 0 from then on; node 2 "
        "took node rank 1; training again 9.5 s later, from the step-25 checkpoint",
        "local: 100 of 100 steps done",
    ]
    assert head(run, names) == "n-1"
    assert head(ClusterRun(runs[:1], [], 1.0, False, []), names) == "n-0"
