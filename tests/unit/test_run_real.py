"""`entrypoint run` for real: torchrun starts gloo workers that all-reduce over real sockets."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from ports import free_ports

CHECK = str(Path(__file__).parents[1] / "allreduce_check.py")
BASE = {
    "PATH": os.environ["PATH"],
    "HOME": os.environ.get("HOME", "/tmp"),
    "ENTRYPOINT_GPUS_PER_NODE": "0",
    "PYTHONUNBUFFERED": "1",
}


def reports(out_dir):
    return sorted(
        (json.loads(p.read_text()) for p in Path(out_dir).glob("rank*.json")),
        key=lambda r: r["rank"],
    )


def run_nodes(envs: list[dict], timeout: float = 240) -> list[str]:
    """Start one `entrypoint run` per environment at once, wait, check every one exited 0. Past
    the timeout every node is killed and every node's output shown, node 0's included (a node
    that waits for node 0 alone says nothing of why node 0 is not there)."""
    logs = [tempfile.TemporaryFile("w+") for _ in envs]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "entrypoint", "run", "--", "python", CHECK],
            env=BASE | env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for env, log in zip(envs, logs, strict=True)
    ]
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    shown = "\n".join(
        f"--- node started as {env.get('NODE_RANK', env.get('RANK'))}, exit {p.returncode}:\n"
        + out[-3000:]
        for env, p, out in zip(envs, procs, outputs, strict=True)
    )
    assert [p.returncode for p in procs] == [0] * len(procs), shown
    return outputs


def test_one_node_two_cpu_workers(tmp_path):
    env = BASE | {
        "ENTRYPOINT_NPROC_PER_NODE": "2",
        "ALLREDUCE_OUT": str(tmp_path),
        "ENTRYPOINT_RUN_DIR": str(tmp_path / "run"),
    }
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", "run", "--", "python", CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = reports(tmp_path)
    assert [r["rank"] for r in got] == [0, 1]
    assert all(r["world_size"] == 2 and r["sum"] == 3.0 and r["backend"] == "gloo" for r in got)
    assert json.loads((tmp_path / "run" / "node0" / "plan.json").read_text())["world_size"] == 2


def test_two_nodes_hand_started_on_loopback(tmp_path):
    """Two entrypoints as two hand-started nodes (seed 004), two workers each: world size 4."""
    port = free_ports(3)
    run_nodes(
        [
            {
                "NNODES": "2",
                "NODE_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "ENTRYPOINT_NPROC_PER_NODE": "2",
                "ENTRYPOINT_SOCKET_IFNAME": "lo",
                "ALLREDUCE_OUT": str(tmp_path),
                "ENTRYPOINT_RUN_DIR": str(tmp_path / "run"),
            }
            for rank in (1, 0)
        ]
    )  # the worker starts first: order must not matter
    got = reports(tmp_path)
    assert [r["rank"] for r in got] == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["sum"] == 10.0 for r in got)
    plan1 = json.loads((tmp_path / "run" / "node1" / "plan.json").read_text())
    assert plan1["ranks"] == [2, 3] and plan1["env"]["GLOO_SOCKET_IFNAME"] == "lo"


@pytest.mark.parametrize(
    ("offset", "variable"), [(0, "MASTER_PORT"), (1, "ENTRYPOINT_CONTROL_PORT")]
)
def test_node0_whose_port_is_held_says_which_at_once(tmp_path, offset, variable):
    """Node 0 of two, another process already listening on its rendezvous port (torchrun's store
    would fail only after every node joined) or on the entrypoints' channel: one line naming the
    variable and the port, exit 2, before any node is waited for."""
    port = free_ports(3)
    with socket.socket() as held:
        held.bind(("127.0.0.1", port + offset))
        held.listen()
        out = subprocess.run(
            [sys.executable, "-m", "entrypoint", "run", "--", "python", CHECK],
            env=BASE
            | {
                "NNODES": "2",
                "NODE_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "ENTRYPOINT_RUN_DIR": str(tmp_path / "run"),
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"{variable}='{port + offset}': cannot listen on node 0" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_platform_started_processes_run_directly_and_join_as_processes(tmp_path):
    """A platform that starts one process per GPU itself (WORLD_SIZE/RANK with LOCAL_RANK and
    LOCAL_WORLD_SIZE, as torchrun-launched or srun --ntasks-per-node=G tasks see them): no
    launcher is spawned, each process starts the trainer directly and joins node 0's channel as
    a process of its own."""
    port = free_ports(3)
    outputs = run_nodes(
        [
            {
                "WORLD_SIZE": "2",
                "RANK": str(rank),
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "ENTRYPOINT_SOCKET_IFNAME": "lo",
                "ALLREDUCE_OUT": str(tmp_path),
                "ENTRYPOINT_RUN_DIR": str(tmp_path / "run"),
            }
            for rank in (1, 0)
        ]
    )
    got = reports(tmp_path)
    assert [(r["rank"], r["world_size"], r["sum"]) for r in got] == [(0, 2, 3.0), (1, 2, 3.0)]
    plan0 = json.loads((tmp_path / "run" / "node0" / "plan.json").read_text())
    assert (plan0["spawn"], plan0["launcher"], plan0["nnodes"]) == (False, "direct", 2)
    assert "all 2 processes joined" in outputs[1]


def test_json_mode_writes_only_json_lines_of_its_own(tmp_path):
    """ENTRYPOINT_LOG_FORMAT=json: the plan is one event (not the table), every line the
    entrypoint writes is JSON; a secret is masked inside it."""
    env = BASE | {
        "ENTRYPOINT_LOG_FORMAT": "json",
        "ENTRYPOINT_RUN_DIR": str(tmp_path / "run"),
        "HF_TOKEN": "hf_sekrit_value",
    }
    code = "import sys; print('trainer says hi', file=sys.stderr)"
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", "run", "--", "python", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ours = [line for line in out.stderr.splitlines() if line != "[default0]:trainer says hi"]
    events = [json.loads(line) for line in ours]  # fails on any line that is not JSON
    plan = [e for e in events if e["event"] == "plan"]
    assert len(plan) == 1 and plan[0]["world_size"] == 1 and "sources" in plan[0]
    assert "hf_sekrit_value" not in out.stderr
