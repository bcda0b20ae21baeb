"""The all-reduce measurement for real: two entrypoints as two nodes on loopback, torchrun
starting two gloo workers each.

- ENTRYPOINT_PREFLIGHT_ALLREDUCE=true: every worker measures, then execs the trainer in the
  same process, and the trainer's own process group starts clean even with a slow rank 0
  (a measurement on torch's default store prefix fails exactly there: the others read rank 0's
  stale address and get "Connection refused").
- `doctor --allreduce --json`: one JSON object per node, node 0's with the figures.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from ports import free_ports
from test_run_real import BASE, reports

CHECK = str(Path(__file__).parents[1] / "allreduce_check.py")
SIZES = ["1", "4"]  # MiB: small, so that two nodes on loopback finish in seconds


def two_nodes(tmp_path, argv, **env):
    port = free_ports(3)
    procs = {}
    for rank in (1, 0):
        node_env = (
            BASE
            | {
                "NNODES": "2",
                "NODE_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "ENTRYPOINT_NPROC_PER_NODE": "2",
                "ENTRYPOINT_SOCKET_IFNAME": "lo",
                "ENTRYPOINT_RUN_DIR": str(tmp_path / "run"),
                "ENTRYPOINT_HEARTBEAT_INTERVAL": "1",
            }
            | env
        )
        procs[rank] = subprocess.Popen(
            [sys.executable, "-m", "entrypoint", *argv],
            env=node_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    out = {rank: p.communicate(timeout=240) for rank, p in procs.items()}
    return {rank: p.returncode for rank, p in procs.items()}, out


def test_preflight_then_the_trainer_in_the_same_workers(tmp_path):
    codes, out = two_nodes(
        tmp_path,
        ["run", "--", "python", CHECK],
        ENTRYPOINT_PREFLIGHT_ALLREDUCE="true",
        ALLREDUCE_OUT=str(tmp_path),
        ALLREDUCE_RANK0_DELAY="4",
    )
    assert codes == {0: 0, 1: 0}, "\n".join(o[1][-3000:] for o in out.values())
    got = reports(tmp_path)  # the trainer's own all-reduce, after the measurement
    assert [r["rank"] for r in got] == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["sum"] == 10.0 for r in got)
    stdout0 = out[0][0]
    assert "all-reduce: 4 ranks on 2 node(s), gloo on cpu" in stdout0
    assert stdout0.index("all-reduce:") < stdout0.index("ALLREDUCE {")  # measured first
    result = json.loads((tmp_path / "run" / "node0" / "allreduce.json").read_text())
    assert [r["bytes"] for r in result["results"]] == [1 << 20, 16 << 20, 64 << 20]
    assert all(
        r["algbw_gbps"] > 0 and r["busbw_gbps"] > r["algbw_gbps"] and r["wrong"] == 0
        for r in result["results"]
    )  # busbw = algbw x 2(n-1)/n = 1.5 x algbw at n = 4


def test_doctor_allreduce_json_on_every_node(tmp_path):
    codes, out = two_nodes(
        tmp_path, ["doctor", "--allreduce", "--json", "--sizes", ",".join(SIZES), "--iters", "3"]
    )
    reps = {rank: json.loads(o[0]) for rank, o in out.items()}
    problems = {rank: rep["problems"] for rank, rep in reps.items()}
    assert codes == {r: (1 if problems[r] else 0) for r in (0, 1)}, (problems, out[0][1][-3000:])
    assert reps[1]["allreduce"] is None  # global rank 0 measured on node 0
    figures = reps[0]["allreduce"]
    assert (figures["world_size"], figures["nnodes"], figures["backend"]) == (4, 2, "gloo")
    assert [r["bytes"] for r in figures["results"]] == [1 << 20, 4 << 20]
    assert all(r["algbw_gbps"] > 0 and r["busbw_gbps"] > 0 for r in figures["results"])
    assert reps[0]["plan"]["trainer"][:3] == ["python", "-m", "entrypoint.job.allreduce"]
    assert os.path.exists(tmp_path / "run" / "node0" / "plan.json")
