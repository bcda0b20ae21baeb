"""`entrypoint run` as the supervisor of real torchrun workers, two nodes on loopback.

Real processes, real sockets, real signals: a node killed, a node that stops answering, a
worker that crashes (its error shown once, at node 0), a restart that resumes, SIGTERM reaching
every worker, a master that never comes, nodes whose data differ. The same faults across real
containers are in tests/cluster/test_faults.py.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

TRAINER = str(Path(__file__).parents[1] / "fault_trainer.py")
BASE = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
        "ENTRYPOINT_GPUS_PER_NODE": "0", "ENTRYPOINT_NPROC_PER_NODE": "2",
        "ENTRYPOINT_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1",
        "ENTRYPOINT_HEARTBEAT_INTERVAL": "1", "ENTRYPOINT_HEARTBEAT_TIMEOUT": "5"}


def two_free_ports() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


class Nodes:
    def __init__(self, tmp: Path, n: int = 2, **env):
        self.tmp, self.n = tmp, n
        self.port = two_free_ports()
        self.env = BASE | {"NNODES": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.port),
                           "ENTRYPOINT_RUN_DIR": str(tmp / "run"), "FAULT_OUT": str(tmp / "out")} | env
        self.procs: dict[int, subprocess.Popen] = {}
        self.started = time.monotonic()

    def start(self, rank: int, **env) -> subprocess.Popen:
        log = open(self.tmp / f"node{rank}.log", "w")
        self.procs[rank] = subprocess.Popen(
            [sys.executable, "-m", "entrypoint", "run", "--", "python", TRAINER],
            env=self.env | {"NODE_RANK": str(rank)} | env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        return self.procs[rank]

    def log(self, rank: int) -> str:
        return (self.tmp / f"node{rank}.log").read_text()

    def wait(self, timeout: float = 120) -> dict[int, int]:
        end = time.monotonic() + timeout
        for proc in self.procs.values():
            proc.wait(timeout=max(1, end - time.monotonic()))
        return {rank: p.returncode for rank, p in self.procs.items()}

    def wait_training(self, ranks: int, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while len(list((self.tmp / "out").glob("started*"))) < ranks:
            assert time.monotonic() < end, {r: self.log(r)[-2000:] for r in self.procs}
            time.sleep(0.2)
        time.sleep(1)  # a few steps in

    def reports(self) -> list[dict]:
        return sorted((json.loads(p.read_text()) for p in (self.tmp / "out").glob("rank*.json")),
                      key=lambda r: r["rank"])

    def kill_everything(self) -> None:
        for proc in self.procs.values():
            for pid in _tree(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()


def _tree(pid: int) -> list[int]:
    from entrypoint.supervise import descendants

    return [pid, *descendants(pid)]


@pytest.fixture
def nodes(tmp_path):
    made = []

    def make(**env):
        made.append(Nodes(tmp_path, **env))
        return made[-1]

    yield make
    for n in made:
        n.kill_everything()


def test_a_crashing_worker_stops_every_node_and_node_0_shows_its_error_once(nodes):
    c = nodes(FAULT_CRASH="3:15")
    c.start(0), c.start(1)
    assert c.wait() == {0: 1, 1: 1}  # the trainer's own code, on every node
    log0, log1 = c.log(0), c.log(1)
    assert "worker failed: rank 3 on node 1" in log0 and "(local rank 1), exit code 1" in log0
    summary = log0[log0.index("worker failed: rank 3"):]
    assert "ValueError: injected failure on rank 3 at step 15" in summary.split("\n{")[0]
    assert log0.count("worker failed: rank 3") == 1
    assert "ChildFailedError" not in log0 + log1  # torchrun's own traceback is not repeated
    assert "stopped by node 0: node 1" in log1


def test_max_restarts_restarts_every_node_and_resumes_from_the_checkpoint(nodes):
    c = nodes(FAULT_CRASH="3:30", FAULT_STEPS="50", ENTRYPOINT_MAX_RESTARTS="1")
    c.start(0), c.start(1)
    assert c.wait() == {0: 0, 1: 0}, c.log(0)[-3000:]
    got = c.reports()
    assert [(r["rank"], r["restart"], r["start"], r["last_step"]) for r in got] == [
        (r, 1, 20, 50) for r in range(4)]
    assert "restarting every node's trainer (restart 1 of 1)" in c.log(0)


def test_a_killed_node_stops_the_others_within_seconds_naming_it(nodes):
    c = nodes()
    c.start(0), c.start(1)
    c.wait_training(4)
    for pid in _tree(c.procs[1].pid):  # the whole node at once, as a container kill does
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    assert c.procs[0].wait(timeout=30) == 75
    assert time.monotonic() - killed < 15
    assert "lost node 1" in c.log(0) and "connection closed" in c.log(0)


def test_a_silent_node_is_caught_by_the_heartbeat(nodes):
    c = nodes()
    c.start(0), c.start(1)
    c.wait_training(4)
    os.kill(c.procs[1].pid, signal.SIGSTOP)  # node 1's entrypoint hangs; its sockets stay open
    stopped = time.monotonic()
    try:
        assert c.procs[0].wait(timeout=30) == 75
        assert time.monotonic() - stopped < 5 + 15  # the timeout, then the workers stop
        assert "lost node 1" in c.log(0) and "silent for" in c.log(0)
    finally:
        os.kill(c.procs[1].pid, signal.SIGCONT)


def test_sigterm_reaches_every_worker_which_checkpoint_then_the_next_start_resumes(nodes):
    c = nodes(ENTRYPOINT_GRACE_PERIOD="20")
    c.start(0), c.start(1)
    c.wait_training(4)
    sent = time.monotonic()
    c.procs[1].send_signal(signal.SIGTERM)  # one node preempted: every node checkpoints
    assert c.wait(60) == {0: 143, 1: 143}
    assert time.monotonic() - sent < 10
    got = c.reports()
    assert [r["signal"] for r in got] == [15] * 4
    saved = int((c.tmp / "out" / "ckpt").read_text())
    assert saved == got[0]["last_step"] - 1 > 0
    assert "received SIGTERM: forwarded to 2 worker process(es)" in c.log(1)

    again = nodes(FAULT_STEPS=str(saved + 10))
    again.start(0), again.start(1)
    assert again.wait() == {0: 0, 1: 0}
    assert {r["start"] for r in again.reports()} == {saved}


def test_a_master_that_never_starts_ends_the_worker_within_the_bound(nodes):
    c = nodes(ENTRYPOINT_JOIN_TIMEOUT="6")
    began = time.monotonic()
    c.start(1)
    assert c.wait(30) == {1: 75}
    assert time.monotonic() - began < 20
    log = c.log(1)
    assert f"node 0's entrypoint at 127.0.0.1:{c.port + 1} did not answer within 6 s" in log
    assert "nothing listens there yet" in log and "Likely causes" in log


def test_a_late_master_is_waited_for(nodes):
    c = nodes(FAULT_STEPS="20")
    c.start(1)
    time.sleep(4)
    c.start(0)
    assert c.wait() == {0: 0, 1: 0}, c.log(1)[-2000:]
    assert len(c.reports()) == 4


def test_nodes_whose_data_differ_stop_before_training(nodes, tmp_path):
    for name, files in (("a", 3), ("b", 2)):
        for i in range(files):
            (tmp_path / name).mkdir(exist_ok=True)
            (tmp_path / name / f"part{i}").write_text("x" * 10)
    c = nodes()
    c.start(0, ENTRYPOINT_DATA_DIR=str(tmp_path / "a"))
    c.start(1, ENTRYPOINT_DATA_DIR=str(tmp_path / "b"))
    assert c.wait(60) == {0: 2, 1: 2}
    assert "data directory" in c.log(1) and "has 2 files" in c.log(1)
    assert not list((tmp_path / "out").glob("started*"))  # nothing trained


def _forwarded_at(log: str) -> list[float]:
    """Wall times of the entrypoint's 'forwarded to N worker process(es)' lines (JSON logs)."""
    from datetime import datetime

    return [datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
            for line in log.splitlines() if line.startswith("{") and "forwarded to" in line]


def test_sigterm_on_one_node_reaches_every_nodes_workers_within_a_second(nodes):
    """One pod preempted (Kubernetes signals that pod only): node 0 passes the signal on, so
    that every node's workers have it within a second, not only at the trainer's next
    collective (a trainer without a shared stop flag would never learn of it)."""
    c = nodes(ENTRYPOINT_GRACE_PERIOD="20")
    c.start(0), c.start(1)
    c.wait_training(4)
    sent = time.time()
    c.procs[1].send_signal(signal.SIGTERM)
    assert c.wait(60) == {0: 143, 1: 143}
    (on_1,), (on_0,) = _forwarded_at(c.log(1)), _forwarded_at(c.log(0))
    assert on_1 - sent < 1 and on_0 - sent < 1, (on_1 - sent, on_0 - sent)
    forwarded = "received SIGTERM: forwarded to 2 worker process(es)"
    assert "node 1 (" in c.log(0) and forwarded in c.log(0)  # node 0 passed node 1's on
    assert "stopped on SIGTERM, which node 1 (" in c.log(0)  # the one preempted, not node 0


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


def test_a_killed_launcher_leaves_no_worker_behind(nodes):
    """torchrun SIGKILLed (the OOM killer picks the biggest process; here the launcher): its
    workers become orphans of the entrypoint (a subreaper), which kills them, reports exit
    137 (128 + SIGKILL, not Popen's -9) and stops every node; none outlives `run`."""
    c = nodes()
    c.start(0), c.start(1)
    c.wait_training(4)
    workers = [int((c.tmp / "out" / f"started{r}.0").read_text()) for r in range(4)]
    (launcher,) = [pid for pid in _tree(c.procs[1].pid)[1:]
                   if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    os.kill(launcher, signal.SIGKILL)
    killed = time.monotonic()
    assert c.wait(60) == {0: 137, 1: 137}, c.log(1)[-3000:]
    assert time.monotonic() - killed < 20
    assert [pid for pid in workers if _alive(pid)] == []
    assert "killing 2 process(es) left behind by the launcher" in c.log(1)
    assert "worker failed on node 1" in c.log(0)
    assert "torch.distributed.run) was killed by SIGKILL" in c.log(0)  # said once, at node 0


def test_a_secret_in_a_workers_error_is_masked_in_every_log(nodes):
    """A library's error message that quotes a token (a URL with credentials): the entrypoint
    relays the worker's stderr and shows the error at node 0, masked both times."""
    token = "hf_leaky0123456789"
    c = nodes(FAULT_CRASH="3:15", FAULT_CRASH_SAY=f" (token={token})", HF_TOKEN=token)
    c.start(0), c.start(1)
    assert c.wait() == {0: 1, 1: 1}
    summary = c.log(0)[c.log(0).index("worker failed: rank 3"):]
    assert "injected failure on rank 3 at step 15 (token=***)" in summary
    assert "(token=***)" in c.log(1)  # relayed by node 1's entrypoint, masked
    assert token not in c.log(0) + c.log(1)


def test_a_lost_node_started_again_by_its_platform_joins_the_restart(nodes):
    """ENTRYPOINT_MAX_RESTARTS=1 and node 1 killed whole: the survivors restart and wait for it
    (up to ENTRYPOINT_JOIN_TIMEOUT); the platform starts node 1 again, which joins restart 1
    (ENTRYPOINT_RESTART_COUNT=1 on every rank, not 0 on the new node), and all resume."""
    c = nodes(ENTRYPOINT_MAX_RESTARTS="1", FAULT_STEPS="60")
    c.start(0), c.start(1)
    c.wait_training(4)
    for pid in _tree(c.procs[1].pid):
        os.kill(pid, signal.SIGKILL)
    c.procs[1].wait()
    time.sleep(2)
    c.start(1)  # what Kubernetes does with a failed pod of a Job
    assert c.wait() == {0: 0, 1: 0}, c.log(0)[-3000:]
    assert [(r["restart"], r["last_step"]) for r in c.reports()] == [(1, 60)] * 4
    assert "restarting every node's trainer (restart 1 of 1)" in c.log(0)
