"""Node 0's /metrics and `entrypoint status` against real `entrypoint run` nodes on loopback
(issue 25): the per-node series while the job trains, a killed node seen lost while a spare
takes its place, and the exit codes of `status` (0 healthy, 1 degraded, 2 unreachable). A real
Prometheus server scraping node containers is in tests/cluster/test_metrics.py."""

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from test_spares_real import _checkpointed, _signal_tree
from test_supervise_real import ONE_PER_NODE, Nodes, nodes, started  # noqa: F401

HOST = socket.gethostname()


@pytest.fixture
def cluster(started):  # noqa: F811 - the fixture
    return lambda n, **env: started(n, **{"FAULT_STEPS": "200"} | ONE_PER_NODE | env)


def status(c: Nodes, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", "status", *args],
        env=c.env | {"NODE_RANK": "1"},
        capture_output=True,
        text=True,
        timeout=30,
    )


def metrics(c: Nodes) -> str:
    url = f"http://127.0.0.1:{c.port + 2}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def test_metrics_and_status_see_every_node_and_a_lost_one(cluster):
    c = cluster(3, ENTRYPOINT_SPARES="1", ENTRYPOINT_JOB_ID="metrics-test")
    _checkpointed(c, 2)
    text = metrics(c)
    for node in ("0", "1", "2"):
        assert f'multinode_node_up{{host="{HOST}",node="{node}"}} 1.0' in text, text
    assert f'multinode_node_state{{host="{HOST}",node="2",state="standby"}} 1.0' in text
    assert 'multinode_job_info{job="metrics-test",platform="torchrun"} 1.0' in text, [
        line for line in text.splitlines() if "job_" in line
    ]
    assert "multinode_job_world_size 2.0" in text and "multinode_job_spares_left 1.0" in text
    assert "token" not in text.lower()

    healthy = status(c, "--json")
    assert healthy.returncode == 0, healthy.stderr
    job = json.loads(healthy.stdout)
    assert job["health"] == "healthy" and job["phase"] == "run"
    assert [(n["node"], n["state"], n["rank"]) for n in job["members"]] == [
        (0, "training", 0),
        (1, "training", 1),
        (2, "standby", -1),
    ]

    _signal_tree(c, 1, signal.SIGKILL)
    end = time.monotonic() + 60
    while "takes node rank 1" not in c.log(0):
        assert time.monotonic() < end, c.log(0)[-3000:]
        time.sleep(0.2)
    text = metrics(c)
    assert f'multinode_node_up{{host="{HOST}",node="1"}} 0.0' in text, text
    assert "multinode_job_restarts 1.0" in text
    degraded = status(c, "--once")
    assert degraded.returncode == 1, degraded.stdout + degraded.stderr
    assert f"health: lost: node 1 ({HOST})" in degraded.stdout, degraded.stdout
    codes = c.wait()
    assert (codes[0], codes[2]) == (0, 0), c.log(0)[-3000:]


def test_status_of_a_job_that_is_not_there_exits_2_in_one_line(tmp_path):
    c = Nodes(tmp_path, n=2)  # nothing started
    out = status(c)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "cannot be read" in out.stderr, out.stderr
    assert f"http://127.0.0.1:{c.port + 2}/metrics" in out.stderr


def test_metrics_off_with_port_0(cluster):
    c = cluster(2, ENTRYPOINT_METRICS_PORT="0")
    c.wait_training(2)
    with pytest.raises(OSError):
        metrics(c)
    assert status(c).returncode == 2
    c.wait()
