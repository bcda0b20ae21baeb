"""Every rank watched, for real: two `entrypoint run` nodes on loopback, 2 gloo ranks each, torch's
DDP tutorial loop with one rank misbehaving (tests/hang_trainer.py, nothing of this project in
it). A rank that sleeps or waits in a `recv` nobody sends is named with its stack and every node
exits 124; a rank that pauses shorter than the timeout raises nothing; with no setting at all the
learned timeout ends the job within 10 minutes; a rank every step waits for is named as slow, in
the log and in /metrics, also with the default window. A loop with no torch optimizer is watched
by its backward passes. The same across containers: tests/cluster/test_ranks.py."""

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ports import free_ports
from test_supervise_real import BASE as LOOPBACK

TRAINER = str(Path(__file__).parents[1] / "hang_trainer.py")
# OMP_NUM_THREADS=1: both loopback nodes share this machine's cores, as a node's several workers
# do (torchrun sets it so there); a node of one CPU worker is otherwise planned 2 threads, whose
# OpenMP spin after every op cost 33% of a core a worker against 7% (py-spy, 2026-12-07)
BASE = LOOPBACK | {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}


class Job:
    def __init__(self, tmp: Path, **env: str) -> None:
        self.tmp, self.port = tmp, free_ports(3)
        self.env = BASE | {"MASTER_PORT": str(self.port), "ENTRYPOINT_RUN_DIR": str(tmp / "run")}
        self.procs = []
        for rank in (0, 1):
            log = open(tmp / f"node{rank}.log", "w")  # noqa: SIM115 - the node writes it
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "entrypoint", "run", "--", "python", TRAINER],
                    env=self.env | {"NODE_RANK": str(rank)} | env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        self.started = time.monotonic()

    def wait(self, timeout: float) -> list[int]:
        try:
            return [p.wait(timeout=max(1, self.started + timeout - time.monotonic()))
                    for p in self.procs]  # fmt: skip
        finally:
            for p in self.procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                    p.wait()

    def log(self, rank: int) -> str:
        return (self.tmp / f"node{rank}.log").read_text()

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.port + 2}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()


def test_a_rank_that_sleeps_is_named_with_its_stack_and_every_node_exits_124(tmp_path):
    job = Job(tmp_path, ENTRYPOINT_HANG_TIMEOUT="10", HANG_RANK="3", HANG_STEP="20")
    assert job.wait(120) == [124, 124], job.log(0)[-3000:]
    line = next(x for x in job.log(0).splitlines() if "stopping every node (exit 124)" in x)
    assert "rank 3 on node 1" in line and "hang_trainer.py:" in line, line
    assert "time.sleep(3600)" in line and "ranks 0-2 wait in" in line, line
    # torch's Flight Recorder (the plan's TORCH_FR_BUFFER_SIZE, gloo's collectives): DDP's
    # all-reduce of the next step, entered by ranks 0-2, never by rank 3
    assert re.search(r"Flight Recorder: rank 3 never entered collective #\d+ \(gloo:", line), line
    assert "which ranks 0-2 entered" in line, line
    assert "stopped by node 0: rank 3 on node 1" in job.log(1)
    stacks = list((tmp_path / "run" / "node1" / "logs" / "stacks").glob("rank3.pid*.txt"))
    assert stacks and "time.sleep" not in stacks[0].read_text()  # a builtin: the line is ours
    assert "hang_trainer.py" in stacks[0].read_text()


def test_a_loop_with_no_torch_optimizer_is_watched_by_its_backward_passes(tmp_path):
    """The loop updates its weights by hand (no torch.optim, nothing of ours): each backward
    pass is its step. Rank 1 (2 nodes x 1 rank) sleeps: named with its stack, every node exits
    124."""
    job = Job(tmp_path, ENTRYPOINT_HANG_TIMEOUT="10", HANG_RANK="1", HANG_STEP="20",
              UPDATE="hand", ENTRYPOINT_NPROC_PER_NODE="1")  # fmt: skip
    assert job.wait(120) == [124, 124], job.log(0)[-3000:]
    print(f"MEASURED no torch optimizer, a rank asleep: every node out "
          f"{time.monotonic() - job.started:.1f} s after the start")  # fmt: skip
    line = next(x for x in job.log(0).splitlines() if "stopping every node (exit 124)" in x)
    assert "rank 1 on node 1" in line and "time.sleep(3600)" in line, line
    assert "rank 0 waits in" in line, line
    assert re.search(r"Flight Recorder: rank 1 never entered collective #\d+ \(gloo:", line), line


def test_a_rank_in_a_recv_nobody_sends_is_named(tmp_path):
    job = Job(tmp_path, ENTRYPOINT_HANG_TIMEOUT="10", HANG_RANK="1", HANG_STEP="20",
              HANG_KIND="recv")  # fmt: skip
    assert job.wait(120) == [124, 124], job.log(0)[-3000:]
    line = next(x for x in job.log(0).splitlines() if "stopping every node (exit 124)" in x)
    assert "rank 1 on node 0" in line and "in recv (torch/distributed/" in line, line
    assert "Flight Recorder: rank 1 never entered collective #" in line, line


def test_a_hang_is_named_before_the_trainers_own_collective_timeout_fires(tmp_path):
    """The trainer passes init_process_group(timeout=40 s) and sets nothing of ours: without
    the ranks' report of it, torch's timeout failed the job at 40 s naming no rank. 2 nodes x 1
    rank."""
    job = Job(
        tmp_path, HANG_RANK="1", HANG_STEP="20", PG_TIMEOUT="40", ENTRYPOINT_NPROC_PER_NODE="1"
    )
    assert job.wait(150) == [124, 124], job.log(0)[-3000:]
    line = next(x for x in job.log(0).splitlines() if "stopping every node (exit 124)" in x)
    assert "rank 1 on node 1" in line and "time.sleep(3600)" in line, line
    assert "hang timeout 30 s, 0.75 x the trainer's process-group timeout (40 s)" in job.log(0)
    assert "Flight Recorder: rank 1 never entered collective #" in line, line
    assert "Timed out" not in job.log(0) + job.log(1)  # torch's timeout never fired


def test_a_pause_shorter_than_the_timeout_raises_nothing_and_equal_ranks_are_not_slow(tmp_path):
    job = Job(
        tmp_path,
        ENTRYPOINT_NPROC_PER_NODE="1",
        ENTRYPOINT_HANG_TIMEOUT="15",
        ENTRYPOINT_SLOW_NODE_WINDOW="10",
        HANG_RANK="0",
        HANG_STEP="20",
        HANG_KIND="pause",
        HANG_SECONDS="8",
        STEPS="250",
    )
    assert job.wait(180) == [0, 0], job.log(0)[-3000:]
    assert "has not stepped" not in job.log(0) and "is slow" not in job.log(0)


def test_an_evaluation_longer_than_the_timeout_is_no_hang_and_one_that_hangs_is_named(tmp_path):
    """Every rank evaluates for 3 times the hang timeout (model.eval(), forward passes without
    gradients, an all-reduce each batch; no optimizer step) and trains on: no hang. 10 steps
    later the same evaluation with rank 1 asleep in it: caught and named, exit 124. 2 nodes x 1
    rank."""
    job = Job(
        tmp_path,
        ENTRYPOINT_NPROC_PER_NODE="1",
        ENTRYPOINT_HANG_TIMEOUT="4",
        HANG_KIND="evaluate",
        HANG_RANK="1",
        HANG_STEP="20",
        HANG_SECONDS="12",
        STEPS="60",
    )
    assert job.wait(120) == [124, 124], job.log(0)[-3000:]
    logs = job.log(0) + job.log(1)
    assert sorted(re.findall(r"rank (\d) evaluated", logs)) == ["0", "1"], logs[-3000:]
    (line,) = [x for x in job.log(0).splitlines() if "stopping every node (exit 124)" in x]
    assert "rank 1 on node 1" in line and "hang_trainer.py" in line, line


def test_a_rank_every_step_waits_for_is_named_slow_in_the_log_and_metrics(tmp_path):
    job = Job(
        tmp_path,
        ENTRYPOINT_SLOW_NODE_WINDOW="10",
        HANG_RANK="3",
        HANG_STEP="0",
        HANG_KIND="slow",
        HANG_SECONDS="0.25",
        STEPS="110",
    )
    # 110 steps of 0.3 s take 40 s idle; beside the whole unit suite on 2 cores, CI's run of
    # 2026-12-07 named the rank 92 s after the start and the job ran past 120 s
    deadline = time.monotonic() + 200
    scraped = ""
    while time.monotonic() < deadline and "is slow" not in job.log(0):
        time.sleep(1)
    try:
        scraped = job.metrics()
    except OSError:
        pass
    assert job.wait(300) == [0, 0], job.log(0)[-3000:]
    slow = [x for x in job.log(0).splitlines() if "is slow" in x]
    assert len(slow) == 1 and "rank 3 on node 1" in slow[0], slow
    assert "multinode_rank_slow{host=" in scraped and 'rank="3"} 1.0' in scraped, scraped[-3000:]
    assert 'rank="0"} 0.0' in scraped
    assert "multinode_job_goodput_ratio" in scraped and "multinode_rank_steps" in scraped


def test_with_no_setting_a_rank_half_a_second_slower_is_named_within_the_default_window(
    tmp_path,
):
    """No ENTRYPOINT_SLOW_NODE_WINDOW (120 s by default): of 2 nodes x 1 rank (2 minutes of
    4 ranks cost the whole suite's processes too much CPU), rank 1 sleeps 0.5 s before each step
    for about 2 minutes. It is named once, in the log and /metrics, within the window of its
    training; rank 0 is not."""
    job = Job(tmp_path, ENTRYPOINT_NPROC_PER_NODE="1", HANG_RANK="1", HANG_STEP="0",
              HANG_KIND="slow", HANG_SECONDS="0.5", STEPS="230")  # fmt: skip
    deadline = time.monotonic() + 200
    training = None  # when rank 0 began training (under load the start takes 10 to 20 s)
    while time.monotonic() < deadline and "is slow" not in job.log(0):
        if training is None and "rank 0 training" in job.log(0):
            training = time.monotonic()
        time.sleep(0.5)
    named = time.monotonic() - (training or job.started)
    scraped = job.metrics()
    # the job's 230 steps take 2 minutes idle; under CI's load over 3 (a wait of 200 s from the
    # start ran out in CI at 0ee4730)
    assert job.wait(420) == [0, 0], job.log(0)[-3000:]
    slow = [x for x in job.log(0).splitlines() if "is slow" in x]
    assert len(slow) == 1 and "rank 1 on node 1" in slow[0] and "for 120 s" in slow[0], slow
    flags = dict(re.findall(r'multinode_rank_slow\{[^}]*rank="(\d+)"\} (\S+)', scraped))
    assert flags == {"0": "0.0", "1": "1.0"}, scraped[-3000:]
    print(f"MEASURED slow rank, the default 120 s window: named {named:.0f} s after training began")
    assert training is not None and named < 120 + 5, job.log(0)[-3000:]


def test_with_no_setting_the_learned_timeout_ends_a_hang_within_10_minutes(tmp_path):
    job = Job(tmp_path, HANG_RANK="3", HANG_STEP="20")
    assert job.wait(600) == [124, 124], job.log(0)[-3000:]
    took = time.monotonic() - job.started
    line = next(x for x in job.log(0).splitlines() if "stopping every node (exit 124)" in x)
    assert "rank 3 on node 1" in line and "learned" in line, line
    assert took < 600
