"""Spares and shrinking with real `entrypoint run` nodes on loopback: real torchrun workers
(tests/fault_trainer.py: gloo all-reduces, a step checkpoint), real sockets, real SIGKILL and
SIGSTOP. The same across node containers is in tests/cluster/test_spares.py."""

import os
import signal
import time

import pytest
from test_supervise_real import ONE_PER_NODE, Nodes, _tree, nodes, started  # noqa: F401

STEPS = "160"


@pytest.fixture
def cluster(started):  # noqa: F811 - the fixture
    return lambda n, **env: started(n, **{"FAULT_STEPS": STEPS} | ONE_PER_NODE | env)


def _checkpointed(c: Nodes, ranks: int) -> None:
    """Every rank trains and a checkpoint exists, so that a restart resumes from it."""
    c.wait_training(ranks)
    end = time.monotonic() + 60
    while not (c.tmp / "out" / "ckpt").exists():
        assert time.monotonic() < end, c.log(0)[-3000:]
        time.sleep(0.1)


def _signal_tree(c: Nodes, rank: int, sig: int) -> None:
    for pid in _tree(c.procs[rank].pid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _finished(c: Nodes, world: int, restart: int) -> None:
    """Every rank of the last start finished, resumed from the checkpoint. A rank of an earlier,
    larger world may have left its report too (stopped between two steps, it writes one)."""
    every = c.reports()
    reports = [r for r in every if r["restart"] == restart]
    assert [(r["rank"], r["world_size"], r["last_step"]) for r in reports] == [
        (rank, world, int(STEPS)) for rank in range(world)
    ], every
    assert all(r["restart"] < restart and r["rank"] >= world for r in every if r not in reports)
    assert all(0 < r["start"] < int(STEPS) for r in reports), reports  # resumed, not fresh


def test_a_killed_node_is_replaced_by_the_spare_and_training_finishes(cluster):
    c = cluster(3, ENTRYPOINT_SPARES="1")
    _checkpointed(c, 2)
    _signal_tree(c, 1, signal.SIGKILL)
    codes = c.wait()
    assert (codes[0], codes[2]) == (0, 0), c.log(0)[-3000:]
    _finished(c, 2, 1)
    log = c.log(0)
    assert "training on 2 of 2 nodes; 1 standby (2)" in log
    assert "restart 1: node 2 takes node rank 1; training on 2 of 2 nodes; 0 standby" in log
    assert "node 0 seated this node in node rank 1 of 2 (it stood by)" in c.log(2)


def test_a_paused_node_is_replaced_by_the_spare_and_ends_when_it_wakes(cluster):
    c = cluster(3, ENTRYPOINT_SPARES="1")
    _checkpointed(c, 2)
    _signal_tree(c, 1, signal.SIGSTOP)
    paused = time.monotonic()
    while "takes node rank 1" not in c.log(0):
        assert time.monotonic() - paused < 30, c.log(0)[-3000:]
        time.sleep(0.2)
    _signal_tree(c, 1, signal.SIGCONT)  # it wakes to a closed channel: it stops, named
    codes = c.wait()
    assert codes == {0: 0, 1: 75, 2: 0}, c.log(1)[-2000:]
    assert "silent for" in c.log(0)
    assert "stopped by node 0: node 0 dropped this node, silent for" in c.log(1)
    _finished(c, 2, 1)


def test_with_min_nodes_a_lost_node_shrinks_the_job_onto_the_survivors(cluster):
    c = cluster(3, ENTRYPOINT_MIN_NODES="2")
    _checkpointed(c, 3)
    _signal_tree(c, 1, signal.SIGKILL)
    codes = c.wait()
    assert (codes[0], codes[2]) == (0, 0), c.log(0)[-3000:]
    _finished(c, 2, 1)  # 2 nodes x 1 process
    assert "node 2 moves from node rank 2 to 1; training on 2 of 3 nodes" in c.log(0)


def test_a_lost_standby_is_logged_and_the_job_goes_on(cluster):
    c = cluster(3, ENTRYPOINT_SPARES="1")
    _checkpointed(c, 2)
    _signal_tree(c, 2, signal.SIGKILL)
    codes = c.wait()
    assert (codes[0], codes[1]) == (0, 0), c.log(0)[-3000:]
    reports = c.reports()
    assert {(r["restart"], r["start"], r["last_step"]) for r in reports} == {(0, 0, int(STEPS))}
    assert "lost standby node 2" in c.log(0)
