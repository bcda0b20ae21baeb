"""The all-reduce measurement's figures (nccl-tests' definitions) and the plan's preflight."""

import pytest

from conftest import node
from entrypoint.job.allreduce import bandwidth, summary, table, then_command
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.node_plan import ALLREDUCE, make_plan

TWO_NODES = {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "node-0", "MASTER_PORT": "29500"}
PREFLIGHT = {"ENTRYPOINT_PREFLIGHT_ALLREDUCE": "true"}


@pytest.mark.parametrize(
    "nbytes, seconds, world, algbw, busbw",
    [
        # nccl-tests doc/PERFORMANCE.md: algbw = S / t; busbw = algbw x 2(n-1)/n for all-reduce
        (1 << 30, 0.01, 16, 107.374, 201.327),  # 1 GiB in 10 ms over 16 GPUs
        (64 << 20, 0.1, 4, 0.671, 1.007),
        (1 << 20, 0.001, 2, 1.049, 1.049),  # n = 2: bus = algorithm bandwidth
        (1 << 20, 0.001, 1, 1.049, 0.0),  # one rank moves nothing over a bus
    ],
)
def test_bandwidth_as_nccl_tests_defines_it(nbytes, seconds, world, algbw, busbw):
    got = bandwidth(nbytes, seconds, world)
    assert got == (pytest.approx(algbw, abs=1e-3), pytest.approx(busbw, abs=1e-3))


def test_summary_and_table():
    result = summary(
        backend="nccl",
        device="cuda",
        world=16,
        nnodes=2,
        warmup=2,
        iters=5,
        measured=[(1 << 20, 50e-6, 60e-6, 0), (64 << 20, 800e-6, 900e-6, 0)],
    )
    assert [r["count"] for r in result["results"]] == [262144, 16777216]
    assert result["results"][1]["time_us"] == pytest.approx(800)
    text = table(result)
    assert text.splitlines()[0] == (
        "all-reduce: 16 ranks on 2 node(s), nccl on cuda, float32 sum, 5 timed after 2 warm-up"
    )
    assert "algbw (GB/s)" in text and "busbw (GB/s)" in text
    row = text.splitlines()[3].split()
    assert row[:3] == ["64", "MiB", "16777216"] and float(row[5]) == pytest.approx(
        83.886 * 1.875, abs=1e-2
    )


@pytest.mark.parametrize(
    "then, command",
    [
        (["python", "train.py", "--lr", "1"], ["/py", "-u", "train.py", "--lr", "1"]),
        (["--", "python", "-m", "entrypoint.job"], ["/py", "-u", "-m", "entrypoint.job"]),
        (["train.py"], ["/py", "-u", "train.py"]),
        (["bash", "run.sh"], ["bash", "run.sh"]),
    ],
)
def test_the_trainer_is_started_as_torchrun_would(then, command):
    assert then_command(then, "/py") == command


def test_preflight_puts_the_measurement_before_the_trainer_in_each_worker():
    plan = make_plan(TWO_NODES | PREFLIGHT, node(8), ["python", "train.py"])
    assert plan.command[-5:] == (
        "--module",
        "entrypoint.job.allreduce",
        "--then",
        "python",
        "train.py",
    )
    assert plan.trainer == ("python", "train.py")  # what the user runs; the preflight comes first
    assert "each worker measures" in str(plan.sources["preflight_allreduce"])
    builtin = make_plan(TWO_NODES | PREFLIGHT, node(8))
    assert builtin.command[-6:] == (
        "--module",
        "entrypoint.job.allreduce",
        "--then",
        "python",
        "-m",
        "entrypoint.job",
    )


def test_without_the_setting_the_trainer_is_untouched():
    plan = make_plan(TWO_NODES, node(8), ["python", "train.py"])
    assert plan.command[-1] == "train.py" and "preflight_allreduce" not in plan.sources


def test_doctor_allreduce_is_not_measured_twice():
    plan = make_plan(TWO_NODES | PREFLIGHT, node(8), [*ALLREDUCE, "--format", "none"])
    assert plan.command.count("entrypoint.job.allreduce") == 1 and "--then" not in plan.command


@pytest.mark.parametrize(
    "env, launcher",
    [
        ({"ENTRYPOINT_JOB": "jax"}, "jax"),
        ({"ENTRYPOINT_LAUNCHER": "direct"}, "direct"),
        # Kubeflow PyTorchJob pods without nprocPerNode: one process per pod, started by the
        # platform
        (
            {
                "WORLD_SIZE": "16",
                "RANK": "3",
                "LOCAL_RANK": "3",
                "LOCAL_WORLD_SIZE": "8",
                "MASTER_ADDR": "m",
                "MASTER_PORT": "23456",
            },
            "direct",
        ),
    ],
)
def test_refused_where_no_torchrun_starts_the_workers(env, launcher):
    base = {} if "WORLD_SIZE" in env else TWO_NODES
    with pytest.raises(ConfigError) as err:
        make_plan(base | PREFLIGHT | env, node(8))
    line = err.value.line()
    assert line.startswith(
        "ENTRYPOINT_PREFLIGHT_ALLREDUCE='true': measures in the workers "
        f"torchrun starts, then execs the trainer in them; the {launcher} "
        "launcher starts no torchrun. Unset it"
    )
    assert "entrypoint doctor --allreduce" in line
