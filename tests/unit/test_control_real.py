"""The control channel between real `entrypoint run` processes on loopback (issue 17), no
Docker: a node with the wrong token, and nodes that plan different job shapes. The same across
real containers: tests/cluster/test_control.py."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

from tests.unit.test_supervise_real import ONE_PER_NODE, nodes  # noqa: F401 - the fixture

TOKEN = "a3f1c2e4b5d6a7f8091a2b3c4d5e6f70"
WRONG = "9c2e7a41f0b3d865e1a7c4f92d0b6e38"  # random too: a token of low variety is refused first


def test_a_node_with_the_wrong_token_is_refused_and_the_job_goes_on(nodes):  # noqa: F811
    c = nodes(FAULT_STEPS="30", ENTRYPOINT_JOB_TOKEN=TOKEN, **ONE_PER_NODE)
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
    c = nodes(
        FAULT_STEPS="250",
        ENTRYPOINT_HEARTBEAT_INTERVAL="",
        ENTRYPOINT_HEARTBEAT_TIMEOUT="",
        **ONE_PER_NODE,
    )
    c.start(0), c.start(1)
    c.wait_training(2)
    os.kill(c.procs[1].pid, signal.SIGSTOP)
    time.sleep(1.5)
    os.kill(c.procs[0].pid, signal.SIGSTOP)
    time.sleep(1.5)
    os.kill(c.procs[1].pid, signal.SIGCONT)
    time.sleep(1.5)
    os.kill(c.procs[0].pid, signal.SIGCONT)
    assert c.wait() == {0: 0, 1: 0}, c.log(0)[-3000:]
    assert "silent for" not in c.log(0) + c.log(1)


def test_a_stall_of_the_whole_machine_longer_than_the_timeout_is_no_false_alarm(nodes):  # noqa: F811
    """Both entrypoints held up 7 s at once, past the 5 s heartbeat timeout: what a machine under
    memory reclaim or a flushing disk does to every process on it (CI: a 9 GB registry push
    beside two node containers held both entrypoints 6 s, twice, and node 0 named itself
    lost). Neither counts the time it was held up itself as the other's silence: both finish
    with exit 0, and each says it was held up."""
    c = nodes(**ONE_PER_NODE)
    c.start(0), c.start(1)
    c.wait_training(2)
    for proc in c.procs.values():
        os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(7)
    os.kill(c.procs[0].pid, signal.SIGCONT)
    time.sleep(0.5)  # node 0 runs again first: node 1's beats are not waiting for it yet
    os.kill(c.procs[1].pid, signal.SIGCONT)
    assert c.wait() == {0: 0, 1: 0}, c.log(0)[-3000:] + c.log(1)[-2000:]
    assert "silent for" not in c.log(0) + c.log(1)
    for rank in (0, 1):
        assert "starved of CPU or stopped meanwhile" in c.log(rank), c.log(rank)[-2000:]


def test_two_nodes_join_and_train_over_ipv6_loopback(nodes, unavailable):  # noqa: F811
    """MASTER_ADDR=[::1]: node 0's control server on :: (dual stack), node 1 joins over ::1,
    torchrun's rendezvous on ::1, NCCL told AF_INET6 (gloo here); both finish."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        unavailable("this host cannot bind ::1")
    c = nodes(MASTER_ADDR="[::1]", FAULT_STEPS="10")
    c.start(0), c.start(1)
    assert c.wait() == {0: 0, 1: 0}, c.log(0)[-3000:] + c.log(1)[-3000:]
    assert "[::1]:" in c.log(0), c.log(0)[-3000:]


class Shedding(threading.Thread):
    """A relay in front of node 0's control port that does what node 0 does to the oldest
    connections under a flood: the first `shed` connections are closed once their hello has
    arrived, before any welcome; the later ones are relayed both ways."""

    def __init__(self, upstream: int, shed: int) -> None:
        super().__init__(daemon=True)
        self.upstream, self.shed = upstream, shed
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]

    def run(self) -> None:
        while True:
            try:
                node, _ = self.listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                node.close()  # node 0 not listening yet: the node retries, as it would
                continue
            if self.shed:
                self.shed -= 1
                node.sendall(up.recv(65536))  # node 0's challenge
                got = b""
                while b"\n" not in got:
                    got += node.recv(65536) or b"\n"
                node.close(), up.close()
                continue
            for a, b in ((node, up), (up, node)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_a_node_whose_connection_node_0_sheds_before_its_welcome_joins_again(nodes):  # noqa: F811
    """Issue 28: under a flood node 0 drops connections that wait for their hello, and a node
    whose hello was dropped never tried again (exit 75, 'container killed'). Now a connection
    closed before node 0's welcome is joined again, with backoff, within the join timeout;
    with a token, both nodes train and finish."""
    c = nodes(FAULT_STEPS="20", ENTRYPOINT_JOB_TOKEN=TOKEN, **ONE_PER_NODE)
    relay = Shedding(c.port + 1, shed=3)
    relay.start()
    c.start(0)
    c.start(1, ENTRYPOINT_CONTROL_PORT=str(relay.port))
    assert c.wait() == {0: 0, 1: 0}, c.log(1)[-3000:]
    log1 = c.log(1)
    assert log1.count("closed the connection before answering this node's hello") == 3, log1
    assert "joining again in" in log1 and TOKEN not in log1
    relay.listener.close()
