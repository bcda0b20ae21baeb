"""The control channel between real `entrypoint run` processes on loopback (issue 17), no
Docker: a node with the wrong token, and nodes that plan different job shapes. The same across
real containers: tests/cluster/test_control.py."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from tests.unit.test_supervise_real import nodes  # noqa: F401 - the fixture

TOKEN = "a3f1c2e4b5d6a7f8091a2b3c4d5e6f70"
WRONG = "9c2e7a41f0b3d865e1a7c4f92d0b6e38"  # random too: a token of low variety is refused first


def test_a_node_with_the_wrong_token_is_refused_and_the_job_goes_on(nodes):  # noqa: F811
    c = nodes(FAULT_STEPS="30", ENTRYPOINT_JOB_TOKEN=TOKEN)
    c.start(0)
    intruder = c.start(1, ENTRYPOINT_JOB_TOKEN=WRONG)
    assert intruder.wait(timeout=60) == 2
    line = ("refused node 1 (", ": wrong job token: its ENTRYPOINT_JOB_TOKEN is not node 0's")
    assert all(part in c.log(1) for part in line) and "node 0 refused node 1" in c.log(1)
    assert all(part in c.log(0) for part in line)
    c.start(1)  # the real node 1
    assert c.wait() == {0: 0, 1: 0}, c.log(0)[-3000:]
    assert TOKEN not in c.log(0) + c.log(1) and WRONG not in c.log(0) + c.log(1)


def test_nodes_that_plan_another_job_shape_stop_before_training(nodes):  # noqa: F811
    """Node 1 told ENTRYPOINT_NNODES=4 while node 0 plans 2 (issue 17): both exit 2 before any
    worker starts, node 1 and the fields named."""
    c = nodes()
    c.start(0)
    c.start(1, ENTRYPOINT_NNODES="4")
    assert c.wait(60) == {0: 2, 1: 2}
    why = f"node 1 ({socket.gethostname()}) plans another job shape: nnodes 4 vs 2 on node 0"
    assert why in c.log(0) and why in c.log(1)
    assert "world_size 8 vs 4" in c.log(0)
    assert not (c.tmp / "out").exists() or not list((c.tmp / "out").glob("started*"))


def test_overlapping_stalls_of_two_entrypoints_are_no_false_alarm(nodes):  # noqa: F811
    """Node 1's entrypoint stopped 3 s, node 0's stopped 3 s from 1.5 s later (issue 17's no
    false alarm, at the default 1 s / 5 s): node 0 reads the beats that waited for it before
    it judges anyone silent, and both finish with exit 0."""
    c = nodes(FAULT_STEPS="250", ENTRYPOINT_HEARTBEAT_INTERVAL="", ENTRYPOINT_HEARTBEAT_TIMEOUT="")
    c.start(0), c.start(1)
    c.wait_training(4)
    os.kill(c.procs[1].pid, signal.SIGSTOP)
    time.sleep(1.5)
    os.kill(c.procs[0].pid, signal.SIGSTOP)
    time.sleep(1.5)
    os.kill(c.procs[1].pid, signal.SIGCONT)
    time.sleep(1.5)
    os.kill(c.procs[0].pid, signal.SIGCONT)
    assert c.wait() == {0: 0, 1: 0}, c.log(0)[-3000:]
    assert "silent for" not in c.log(0) + c.log(1)


def test_two_nodes_join_and_train_over_ipv6_loopback(nodes):  # noqa: F811
    """MASTER_ADDR=[::1]: node 0's control server on :: (dual stack), node 1 joins over ::1,
    torchrun's rendezvous on ::1, NCCL told AF_INET6 (gloo here); both finish."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this host cannot bind ::1")
    c = nodes(MASTER_ADDR="[::1]", FAULT_STEPS="10")
    c.start(0), c.start(1)
    assert c.wait() == {0: 0, 1: 0}, c.log(0)[-3000:] + c.log(1)[-3000:]
    assert "[::1]:" in c.log(0), c.log(0)[-3000:]
