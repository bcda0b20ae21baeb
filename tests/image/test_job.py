"""The built-in jobs for real, in the image: `docker run IMAGE` with no command.

Each worker's own report (<output>/results/rank<R>.json, the output directory a volume here)
is what these tests read, as the cluster tests do. Two nodes on one container's loopback stand
in for two machines where the subject is the job (data parallelism, checkpoints, resume), not
the network; tests/cluster has the real multi-container runs.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

CPU = {"ENTRYPOINT_GPUS_PER_NODE": "0"}


def writable(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o777)  # the image runs as uid 1000
    return path


def docker_env(env: dict[str, str]) -> tuple[str, ...]:
    return tuple(arg for key, value in env.items() for arg in ("-e", f"{key}={value}"))


def one_node(image, output: Path, **settings) -> str:
    """`docker run IMAGE` (the default command, `run`) with the output as a volume."""
    env = CPU | {"ENTRYPOINT_JOB_OUTPUT": "/out"} | settings
    proc = image.run(
        docker_args=("--shm-size=1g", "-v", f"{writable(output)}:/out", *docker_env(env)),
        timeout=600,
    )
    return proc.stdout + proc.stderr


def two_nodes(image, outputs: tuple[Path, Path], **settings) -> str:
    """Two hand-started nodes (NNODES/NODE_RANK/MASTER_*) on one container's loopback."""
    env = (
        CPU
        | {
            "NNODES": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
            "ENTRYPOINT_SOCKET_IFNAME": "lo",
        }
        | settings
    )
    script = (
        "NODE_RANK=1 ENTRYPOINT_JOB_OUTPUT=/out1 entrypoint run & one=$!; "
        "NODE_RANK=0 ENTRYPOINT_JOB_OUTPUT=/out0 entrypoint run; zero=$?; "
        "wait $one; exit $((zero + $?))"
    )
    proc = image.run(
        "-c",
        script,
        entrypoint="sh",
        timeout=600,
        docker_args=(
            "--shm-size=1g",
            "-v",
            f"{writable(outputs[0])}:/out0",
            "-v",
            f"{writable(outputs[1])}:/out1",
            *docker_env(env),
        ),
    )
    return proc.stdout + proc.stderr


def results(output: Path) -> list[dict]:
    return sorted(
        (json.loads(p.read_text()) for p in (output / "results").glob("rank*.json")),
        key=lambda r: r["rank"],
    )


def assert_trained(got, *, world_size, backend, steps):
    assert [r["rank"] for r in got] == list(range(world_size))
    for r in got:
        assert (r["world_size"], r["backend"], r["steps"]) == (world_size, backend, steps), r
        assert r["final_loss"] < r["first_loss"] - 1.0, r  # from ~4.3 (guessing is 4.16)
    assert sum(r["checkpoint_writer"] for r in got) == 1
    assert got[0]["checkpoint_writer"]


# DeepSpeed ZeRO-2, 1 node x 2 CPU workers ------------------------------------------------


@pytest.fixture(scope="module")
def deepspeed_run(image, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deepspeed")
    log = one_node(
        image,
        tmp / "out",
        ENTRYPOINT_NPROC_PER_NODE="2",
        ENTRYPOINT_JOB_STEPS="30",
        ENTRYPOINT_JOB_SAVE_EVERY="15",
    )
    return tmp, log


def test_deepspeed_two_workers_train_and_loss_falls(deepspeed_run):
    tmp, _ = deepspeed_run
    got = results(tmp / "out")
    assert_trained(got, world_size=2, backend="gloo", steps=30)
    assert [r["local_rank"] for r in got] == [0, 1]
    assert all(r["resumed_from"] is None and r["device"] == "cpu" for r in got)
    assert got[0]["global_batch"] == 16  # the cpu config's train_batch_size
    assert got[0]["final_loss"] == got[1]["final_loss"]  # the mean over workers, on each


def test_deepspeed_logs_on_rank_zero_only(deepspeed_run):
    _, log = deepspeed_run
    assert "[job] step 30/30 loss" in log and "train:" in log
    assert log.count("[job] step 10/30") == 1  # one worker prints, not two
    assert "[job rank 1]" not in log


def test_deepspeed_writes_one_logical_checkpoint(deepspeed_run):
    tmp, _ = deepspeed_run
    checkpoints = tmp / "out" / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step30"
    files = sorted(p.name for p in (checkpoints / "step30").iterdir())
    assert files == [
        "job.json",
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    assert (checkpoints / "step15").is_dir()


def test_deepspeed_restart_resumes_from_the_last_checkpoint(image, deepspeed_run):
    tmp, _ = deepspeed_run
    before = results(tmp / "out")
    log = one_node(image, tmp / "out", ENTRYPOINT_NPROC_PER_NODE="2", ENTRYPOINT_JOB_STEPS="40")
    assert "resuming from checkpoint" in log and "step30" in log
    got = results(tmp / "out")
    assert all((r["resumed_from"], r["steps"], r["trained_steps"]) == (30, 40, 10) for r in got)
    # Weights and optimizer came back: the loss goes on from where it was, not from ~4.3.
    assert abs(got[0]["first_loss"] - before[0]["final_loss"]) < 0.5
    assert got[0]["first_loss"] < before[0]["first_loss"] - 1.0
    assert (tmp / "out" / "checkpoints" / "latest").read_text().strip() == "step40"


# JAX, two processes (two hand-started nodes) on loopback ----------------------------------


def test_jax_two_processes_train_data_parallel(image, tmp_path):
    out = tmp_path / "out"
    two_nodes(image, (out, out), ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS="30")
    got = results(out)
    assert_trained(got, world_size=2, backend="jax-cpu", steps=30)
    assert [(r["node_rank"], r["devices"]) for r in got] == [(0, 2), (1, 2)]
    assert (out / "jax-checkpoints" / "step30.npz").is_file()

    # The same global batch in one process gives the same losses: the sharding is right.
    one_node(image, tmp_path / "single", ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS="30")
    single = results(tmp_path / "single")[0]
    assert single["world_size"] == 1
    assert single["final_loss"] == pytest.approx(got[0]["final_loss"], abs=1e-3)


def test_jax_restart_resumes_and_unshared_outputs_start_fresh(image, tmp_path):
    shared = tmp_path / "shared"
    two_nodes(image, (shared, shared), ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS="10")
    log = two_nodes(image, (shared, shared), ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS="20")
    assert "resuming from checkpoint" in log
    assert all(r["resumed_from"] == 10 and r["steps"] == 20 for r in results(shared))

    # Each node its own disk, the checkpoint on node 0's alone: both start fresh, in step.
    apart = (tmp_path / "node0", tmp_path / "node1")
    shutil.copytree(shared / "jax-checkpoints", writable(apart[0]) / "jax-checkpoints")
    for path in apart[0].rglob("*"):
        os.chmod(path, 0o777)
    log = two_nodes(image, apart, ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS="10")
    assert "starting fresh: not every process" in log
    assert [r["resumed_from"] for r in results(apart[0]) + results(apart[1])] == [None, None]
    assert list(apart[0].glob("jax-checkpoints.old-*"))  # moved aside, never deleted
