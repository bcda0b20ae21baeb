"""The built-in job for real, through `python -m entrypoint run` with no command, on this machine.

Each worker's own report (<output>/results/rank<R>.json) is what these tests read, as the
cluster tests do. The platform is forced (local, or torchrun-style hand-started nodes) so that
these tests are about the job, not about platform detection.
First run on a fresh machine: DeepSpeed JIT-builds its CPU shm op (a few minutes, then cached).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PASS = ("PATH", "HOME", "TORCH_EXTENSIONS_DIR", "PYTHONPATH")
BASE = {k: os.environ[k] for k in PASS if k in os.environ} | {
    "ENTRYPOINT_GPUS_PER_NODE": "0", "PYTHONUNBUFFERED": "1"}
TIMEOUT = 600  # generous: includes DeepSpeed's one-time op build on a fresh machine


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def entrypoint_run(env):
    return subprocess.Popen([sys.executable, "-m", "entrypoint", "run"], cwd=ROOT, env=BASE | env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(*procs):
    outputs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n----\n".join(
        o[-4000:] for o in outputs)
    return outputs


def results(output: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (output / "results").glob("rank*.json")),
                  key=lambda r: r["rank"])


def one_node(tmp: Path, output: Path, **settings):
    env = {"ENTRYPOINT_PLATFORM": "local", "ENTRYPOINT_RUN_DIR": str(tmp / "run"),
           "ENTRYPOINT_JOB_OUTPUT": str(output)} | settings
    return finish(entrypoint_run(env))[0]


def two_nodes(tmp: Path, outputs: tuple[Path, Path], **settings):
    """Two hand-started nodes (NNODES/NODE_RANK/MASTER_*) on loopback; node 1 starts first."""
    port, procs = free_port(), {}
    for rank in (1, 0):
        procs[rank] = entrypoint_run({
            "ENTRYPOINT_PLATFORM": "torchrun", "NNODES": "2", "NODE_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "ENTRYPOINT_SOCKET_IFNAME": "lo", "ENTRYPOINT_RUN_DIR": str(tmp / "run"),
            "ENTRYPOINT_JOB_OUTPUT": str(outputs[rank])} | settings)
    return finish(procs[0], procs[1])


def assert_trained(got, *, world_size, backend, steps):
    assert [r["rank"] for r in got] == list(range(world_size))
    for r in got:
        assert (r["world_size"], r["backend"], r["steps"]) == (world_size, backend, steps), r
        assert r["final_loss"] < r["first_loss"] - 1.0, r  # from ~4.3 (guessing is 4.16)
    assert sum(r["checkpoint_writer"] for r in got) == 1
    assert got[0]["checkpoint_writer"]


# DeepSpeed ZeRO-2, 1 node x 2 CPU workers ------------------------------------------------

@pytest.fixture(scope="module")
def deepspeed_run(tmp_path_factory):
    pytest.importorskip("deepspeed")
    tmp = tmp_path_factory.mktemp("deepspeed")
    log = one_node(tmp, tmp / "out", ENTRYPOINT_NPROC_PER_NODE="2", ENTRYPOINT_JOB_STEPS="30",
                   ENTRYPOINT_JOB_SAVE_EVERY="15")
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
    assert files == ["job.json", "mp_rank_00_model_states.pt",
                     "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert (checkpoints / "step15").is_dir()


def test_deepspeed_restart_resumes_from_the_last_checkpoint(deepspeed_run):
    tmp, _ = deepspeed_run
    before = results(tmp / "out")
    log = one_node(tmp, tmp / "out", ENTRYPOINT_NPROC_PER_NODE="2", ENTRYPOINT_JOB_STEPS="40")
    assert "resuming from checkpoint" in log and "step30" in log
    got = results(tmp / "out")
    assert all((r["resumed_from"], r["steps"], r["trained_steps"]) == (30, 40, 10) for r in got)
    # Weights and optimizer came back: the loss goes on from where it was, not from ~4.3.
    assert abs(got[0]["first_loss"] - before[0]["final_loss"]) < 0.5
    assert got[0]["first_loss"] < before[0]["first_loss"] - 1.0
    assert (tmp / "out" / "checkpoints" / "latest").read_text().strip() == "step40"


# JAX, two processes (two hand-started nodes) on loopback ----------------------------------

def test_jax_two_processes_train_data_parallel(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "out"
    two_nodes(tmp_path, (out, out), ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS="30")
    got = results(out)
    assert_trained(got, world_size=2, backend="jax-cpu", steps=30)
    assert [(r["node_rank"], r["devices"]) for r in got] == [(0, 2), (1, 2)]
    assert (out / "jax-checkpoints" / "step30.npz").is_file()

    # The same global batch in one process gives the same losses: the sharding is right.
    one_node(tmp_path, tmp_path / "single", ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS="30")
    single = results(tmp_path / "single")[0]
    assert single["world_size"] == 1
    assert single["final_loss"] == pytest.approx(got[0]["final_loss"], abs=1e-3)


def test_jax_restart_resumes_and_unshared_outputs_start_fresh(tmp_path):
    pytest.importorskip("jax")
    shared = tmp_path / "shared"
    two_nodes(tmp_path, (shared, shared), ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS="10")
    logs = two_nodes(tmp_path, (shared, shared), ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS="20")
    assert "resuming from checkpoint" in logs[0]
    assert all(r["resumed_from"] == 10 and r["steps"] == 20 for r in results(shared))

    # Each node its own disk, the checkpoint on node 0's alone: both start fresh, in step.
    apart = (tmp_path / "node0", tmp_path / "node1")
    shutil.copytree(shared / "jax-checkpoints", apart[0] / "jax-checkpoints")
    logs = two_nodes(tmp_path, apart, ENTRYPOINT_JOB="jax", ENTRYPOINT_JOB_STEPS="10")
    assert "starting fresh: not every process" in logs[0]
    assert [r["resumed_from"] for r in results(apart[0]) + results(apart[1])] == [None, None]
    assert list(apart[0].glob("jax-checkpoints.old-*"))  # moved aside, never deleted
