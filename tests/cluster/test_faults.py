"""Faults in real containers (issue 6): a node killed, paused or cut off, SIGTERM and SIGUSR1,
a crashing worker with and without a restart, a killed launcher, secrets in the environment.

Each case is 2 node containers x 2 CPU workers (hand-started nodes: NNODES, NODE_RANK,
MASTER_ADDR) training the image's built-in DeepSpeed job where the job's own behaviour is the
subject (its checkpoint on SIGTERM and its resume, its crash among torch's errors), and
tests/fault_trainer.py where only the entrypoint's is (a node killed, paused or cut off, a
killed launcher, a restart after a crash: the workers import no torch, so a case costs a third
of the CPU), with the fault injected once rank 0 logs
step 10, and asserts exit codes, the time the other nodes took (the product's bound is 60 s;
asserted with margin, as CI machines are slow and shared) and the message. `pytest -s` prints
the measured times (lines `MEASURED ...`): docs/failures.md's table of faults comes from them. The
same faults with processes on loopback, without Docker, are in tests/unit/test_supervise_real.py.

Every case runs with the default settings (ENTRYPOINT_HEARTBEAT_TIMEOUT=5 s,
ENTRYPOINT_GRACE_PERIOD=25 s), so the figures are the ones users get. The whole file takes about
5 minutes on 2 idle cores (each cluster starts in ~12 s idle, ~30 s when the cores are shared).
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import pytest

from entrypoint.local.cluster import LABEL, Node
from faulty_cluster import (
    LIGHT_MOUNT,
    ONE_PER_NODE,
    Fault,
    FaultyCluster,
    FaultyRun,
    hand_started,
    light_started,
    lightened,
)

STEPS = 5000  # never reached (~6 steps/s here): every case but the restart ends by its fault
TRAINING = "step 10/"  # rank 0's line once the job trains ([job] or [fault]): the fault's moment
BOUND = 60  # seconds: every other node has stopped within this after a fault (issue 6)
# A killed, paused or cut-off node ends every node within 10 s (issue 17); asserted with a
# margin for a loaded CI machine, the measured figure printed.
LOST = 20
HEARTBEAT_TIMEOUT = 5  # ENTRYPOINT_HEARTBEAT_TIMEOUT's default
TIMEOUT = 360  # per cluster run: a start takes ~30 s on 2 idle cores, minutes when shared
SHARED = "/shared"  # the shared volume in restart cases, as a cluster's shared filesystem
OUTPUT = f"{SHARED}/job"
SECRETS = {
    "HF_TOKEN": "hf_fAkEtOkEn0123456789",
    "WANDB_API_KEY": "wandbkey-5f4e3d2c1b",
    "MY_SECRET": "my-secret-value-42",
    "DB_PASSWORD": "db-pass-Xyzzy-7",
    "SOME_API_KEY": "some-api-key-31415",
}


def nodes(c: FaultyCluster, **env: str) -> list[Node]:
    """Two nodes started by hand, every secret set on both, training the built-in job."""
    return hand_started(c, STEPS, **SECRETS, **env)


def light(c: FaultyCluster, **env: str) -> list[Node]:
    """The same two nodes training tests/fault_trainer.py (no torch: the cases whose subject is
    the entrypoint's handling of a lost node or launcher, not the trainer's)."""
    return light_started(c, STEPS, **SECRETS, **env)


def when_training(c: FaultyCluster, name: str, action) -> Fault:
    return Fault(name, action, node=c.hostname("node", 0), line=TRAINING)


def took(run: FaultyRun, node: str, fault: str) -> float:
    """Seconds from the fault to the node's exit (polled every 0.5 s)."""
    assert run.node(node).ended is not None, run.log(80)
    return run.node(node).ended - run.faults[fault]


def assert_no_secret(*texts: str) -> None:
    leaked = [name for name, value in SECRETS.items() if any(value in text for text in texts)]
    assert not leaked, f"secret values in the output: {leaked}"


def measured(case: str, seconds: float) -> None:
    print(f"MEASURED {case}: {seconds:.1f} s")


def log_times(run: FaultyRun, node: str, text: str) -> list[float]:
    """Wall times (the structlog timestamp) of the node's JSON log lines containing `text`."""
    return [
        datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
        for line in run.node(node).lines
        if line.startswith("{") and text in line
    ]


@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_node_stops_the_other_naming_it(image, docker_client, victim):
    """`docker kill` of one node mid-training: its connections close, so the other node stops
    at once with 75 (peers unavailable: a platform may retry) and names the lost node; when
    node 0 is the one killed, node 1 says it lost node 0."""
    with FaultyCluster(image, client=docker_client, echo=print, mounts=LIGHT_MOUNT) as c:
        dead, alive = c.hostname("node", victim), c.hostname("node", 1 - victim)
        run = c.run(
            light(c, **ONE_PER_NODE),
            timeout=TIMEOUT,
            grace=90,
            faults=[when_training(c, "kill", lambda c: c.kill(dead))],
        )
        assert run.exit_codes == {dead: 137, alive: 75}, run.log(80)
        assert took(run, alive, "kill") < LOST
        assert f"lost node {victim} ({dead}): its connection closed" in run.node(alive).log(), (
            run.node(alive).log()[-3000:]
        )
        assert_no_secret(run.log())
        measured(f"killed node {victim}: node {1 - victim} exited", took(run, alive, "kill"))


def test_a_paused_node_is_caught_by_the_heartbeat_with_the_defaults(image, docker_client):
    """`docker pause` of node 1: its sockets stay open, only the entrypoints' heartbeat sees it.
    Node 0 stops within ENTRYPOINT_HEARTBEAT_TIMEOUT (5 s) + the workers' 2 s to exit, and
    names it; unpaused afterwards, node 1 reads node 0's verdict and stops too."""
    with FaultyCluster(image, client=docker_client, echo=print, mounts=LIGHT_MOUNT) as c:
        first, paused = c.hostname("node", 0), c.hostname("node", 1)
        run = c.run(
            light(c, **ONE_PER_NODE),
            timeout=TIMEOUT,
            grace=90,
            faults=[
                when_training(c, "pause", lambda c: c.pause(paused)),
                Fault("unpause", lambda c: c.unpause(paused), exited=first),
            ],
        )
        assert run.exit_codes == {first: 75, paused: 75}, run.log(80)
        assert HEARTBEAT_TIMEOUT - 1 < took(run, first, "pause") < LOST  # not before the timeout
        assert f"lost node 1 ({paused}): silent for" in run.node(first).log()
        assert "stopped by node 0: lost node 1" in run.node(paused).log()
        assert_no_secret(run.log())
        measured("paused node 1: node 0 exited", took(run, first, "pause"))


def test_a_node_cut_off_the_network_ends_the_job_on_both_sides(image, docker_client):
    """`docker network disconnect` of node 1: no connection closes and no message passes, so
    both sides see the other go silent and stop on their own after the heartbeat timeout (5 s)
    and the workers' 2 s, each naming the other."""
    with FaultyCluster(image, client=docker_client, echo=print, mounts=LIGHT_MOUNT) as c:
        first, cut = c.hostname("node", 0), c.hostname("node", 1)
        run = c.run(
            light(c, **ONE_PER_NODE),
            timeout=TIMEOUT,
            grace=90,
            faults=[when_training(c, "disconnect", lambda c: c.disconnect(cut))],
        )
        assert run.exit_codes == {first: 75, cut: 75}, run.log(80)
        for node in (first, cut):
            assert HEARTBEAT_TIMEOUT - 1 < took(run, node, "disconnect") < LOST, run.log(40)
        assert f"lost node 1 ({cut}): silent for" in run.node(first).log()
        assert f"node 0 ({first}) silent for" in run.node(cut).log()
        assert_no_secret(run.log())
        measured("partition: node 0 exited", took(run, first, "disconnect"))
        measured("partition: node 1 exited", took(run, cut, "disconnect"))


def test_sigterm_on_one_node_checkpoints_everywhere_and_the_next_start_resumes(
    image, docker_client
):
    """Preemption of one pod (`docker kill --signal SIGTERM` on node 1): the signal reaches node
    1's workers and, through node 0, node 0's within a second; all checkpoint and every
    container exits 143 within ENTRYPOINT_GRACE_PERIOD. The same nodes started again on the
    same shared output resume from that checkpoint (from the workers' own reports), and a
    SIGUSR1 (SLURM's --signal) during that run is forwarded too: checkpoint, exit 138.

    The bound on the exits is the platform's grace (Kubernetes' 30 s), not the entrypoint's
    (25 s): that one ends in the workers' SIGKILL, and the node's exit comes after it."""
    platform_grace = 30  # terminationGracePeriodSeconds; ENTRYPOINT_GRACE_PERIOD is 25 below it
    with FaultyCluster(image, client=docker_client, echo=print, shared=SHARED, output=OUTPUT) as c:
        first, second = c.hostname("node", 0), c.hostname("node", 1)
        sent: dict[str, float] = {}

        def sigterm(c: FaultyCluster) -> None:
            sent["SIGTERM"] = time.time()
            c.kill(second, "SIGTERM")

        run = c.run(
            nodes(c, ENTRYPOINT_JOB_OUTPUT=OUTPUT),
            timeout=TIMEOUT,
            grace=90,
            faults=[when_training(c, "sigterm", sigterm)],
        )
        assert run.exit_codes == {first: 143, second: 143}, run.log(80)
        assert max(took(run, n, "sigterm") for n in (first, second)) < platform_grace
        reached = [
            log_times(run, name, "forwarded to 2 worker process(es)")[0] - sent["SIGTERM"]
            for name in (second, first)
        ]
        assert max(reached) < 2, reached  # within a second; margin for a loaded machine
        assert f"stopped on SIGTERM, which node 1 ({second}) received" in run.node(first).log()
        reports = run.results
        assert [r["rank"] for r in reports] == [0, 1, 2, 3], run.log(60)
        assert {r["stopped_by"] for r in reports} == {"SIGTERM"}
        saved = reports[0]["steps"]
        assert saved >= 10
        assert {r["checkpoint"] for r in reports} == {f"{OUTPUT}/checkpoints/step{saved}"}
        measured("SIGTERM on node 1: reached node 1's workers", reached[0])
        measured("SIGTERM on node 1: reached node 0's workers", reached[1])
        measured(
            "SIGTERM on node 1: both exited 143",
            max(took(run, n, "sigterm") for n in (first, second)),
        )

        again = c.run(
            nodes(c, ENTRYPOINT_JOB_OUTPUT=OUTPUT),
            timeout=TIMEOUT,
            grace=90,
            faults=[
                Fault(
                    "sigusr1",
                    lambda c: c.kill(first, "SIGUSR1"),
                    node=first,
                    line=f"[job] step {saved + 1}/",
                )
            ],
        )
        assert again.exit_codes == {first: 138, second: 138}, again.log(80)
        resumed = again.results
        assert [r["resumed_from"] for r in resumed] == [saved] * 4, resumed
        assert {r["stopped_by"] for r in resumed} == {"SIGUSR1"}
        assert all(
            r["steps"] > saved and r["checkpoint"].endswith(f"step{r['steps']}") for r in resumed
        ), resumed
        assert "received SIGUSR1: forwarded to 2 worker process(es)" in again.node(first).log()
        assert_no_secret(run.log(), again.log())
        measured(
            "SIGUSR1 on node 0: both exited 138",
            max(took(again, n, "sigusr1") for n in (first, second)),
        )


def test_docker_stop_as_kubernetes_ends_a_job_checkpoints_within_the_grace(image, docker_client):
    """Kubernetes deleting the job: SIGTERM to every pod, SIGKILL after
    terminationGracePeriodSeconds (30 s; `docker stop -t 30`). The entrypoint's grace (25 s)
    fits inside it: every worker checkpoints and both containers exit 143 by themselves, before
    the platform's SIGKILL (137) at 30 s."""
    with FaultyCluster(image, client=docker_client, echo=print) as c:
        names = [c.hostname("node", r) for r in (0, 1)]
        run = c.run(
            nodes(c),
            timeout=TIMEOUT,
            grace=90,
            faults=[
                when_training(c, f"stop {r}", lambda c, n=n: c.stop(n, 30))
                for r, n in enumerate(names)
            ],
        )
        assert run.exit_codes == dict.fromkeys(names, 143), run.log(80)  # 137: SIGKILLed
        seconds = max(took(run, n, f"stop {r}") for r, n in enumerate(names))
        assert seconds < 30  # the platform's grace; the entrypoint's (25 s) ends in a SIGKILL
        assert {r["stopped_by"] for r in run.results} == {"SIGTERM"} and len(run.results) == 4
        assert_no_secret(run.log())
        measured("docker stop -t 30 on both: both exited 143", seconds)


def test_a_crashing_worker_stops_both_and_node_0_shows_its_error_once(image, docker_client):
    """Rank 3 (node 1, local rank 1) raises at step 15: both containers exit with the trainer's
    code, 1, and node 0's log shows rank 3's error once: rank, node, exit code, the last lines
    of its traceback, not the gloo errors it caused in the other ranks."""
    with FaultyCluster(image, client=docker_client, echo=print) as c:
        first, second = c.hostname("node", 0), c.hostname("node", 1)
        run = c.run(
            nodes(c, ENTRYPOINT_JOB_FAIL_AT_STEP="15", ENTRYPOINT_JOB_FAIL_RANK="3"),
            timeout=TIMEOUT,
            grace=90,
        )
        assert run.exit_codes == {first: 1, second: 1}, run.log(80)
        log0 = run.node(first).log()
        error = "RuntimeError: injected failure at step 15 on rank 3 (--fail-at-step)"
        head = f"worker failed: rank 3 on node 1 ({second}) (local rank 1), exit code 1"
        assert log0.count(head) == 1 and log0.count(error) == 1, log0[-4000:]
        assert log0.index(head) < log0.index(error)  # the traceback's end is in the summary
        crashed = run.node(second).when(error)
        assert crashed is not None
        seconds = max(run.node(n).ended for n in (first, second)) - crashed
        assert seconds < BOUND
        assert_no_secret(run.log())
        measured("crashing worker: both exited 1", seconds)


def test_a_crashing_worker_restarts_every_node_which_resume_and_finish(image, docker_client):
    """Rank 3 raises at step 25 with ENTRYPOINT_MAX_RESTARTS=1: every node's trainer restarts
    together (the crash fires on the first start only), resumes from the step-20 checkpoint on
    the shared output, trains to the end, and both exit 0. The restart is the entrypoints'
    subject, so the nodes run tests/fault_trainer.py; the built-in job's own resume from its
    checkpoint is tests/image/test_job.py's, on each image."""
    with FaultyCluster(
        image, client=docker_client, echo=print, shared=SHARED, output=OUTPUT, mounts=LIGHT_MOUNT
    ) as c:
        first, second = c.hostname("node", 0), c.hostname("node", 1)
        specs = hand_started(c, 40, **SECRETS, ENTRYPOINT_MAX_RESTARTS="1", FAULT_CRASH="3:25")
        run = c.run(lightened(specs, 40, out=f"{OUTPUT}/results"), timeout=TIMEOUT)
        assert run.exit_codes == {first: 0, second: 0}, run.log(80)
        log0 = run.node(first).log()
        assert log0.count("worker failed: rank 3 on node 1") == 1
        assert "restarting every node's trainer (restart 1 of 1)" in log0
        reports = [(r["start"], r["last_step"], r["restart"]) for r in run.results]
        assert reports == [(20, 40, 1)] * 4, reports
        crashed = run.node(second).when("ValueError: injected failure on rank 3 at step 25")
        resumed = run.node(first).when("rank 0/4 starts at step 20 (restart 1)")
        assert crashed is not None and resumed is not None
        assert_no_secret(run.log())
        measured("crash to training again after the restart", resumed - crashed)


WATCH = r"""
import os, signal, sys, time
def stat(p):
    try:
        return open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return ["gone", "0"]
def cmd(p):
    try:
        return open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
print("pid 1:", cmd(1))
launcher = next(p for p in pids if "torch.distributed.run" in cmd(p))
parent = int(stat(launcher)[1])
print("launcher's parent:", cmd(parent), "whose parent is pid", stat(parent)[1])
workers = [p for p in pids if stat(p)[1] == str(launcher)]
print("workers:", len(workers))
os.kill(launcher, signal.SIGKILL)
began = time.monotonic()
alive = lambda: [p for p in workers if stat(p)[0] not in ("Z", "gone")]
while alive() and time.monotonic() - began < 10:
    time.sleep(0.05)
print(f"workers alive {time.monotonic() - began:.2f} s after: {alive()}")
"""


def test_a_killed_launcher_leaves_no_worker_and_the_container_exits(image, docker_client):
    """PID 1 is tini, its child the entrypoint, a subreaper. torchrun SIGKILLed in node 1 (the
    OOM killer's usual pick is the biggest process; here the launcher): its orphaned workers
    are killed at once, and both containers exit 137 (128 + SIGKILL)."""
    with FaultyCluster(image, client=docker_client, echo=print, mounts=LIGHT_MOUNT) as c:
        first, second = c.hostname("node", 0), c.hostname("node", 1)
        seen: dict[str, tuple[int, str]] = {}
        watch = ["python3", "-c", WATCH]
        run = c.run(
            light(c),
            timeout=TIMEOUT,
            grace=90,
            faults=[
                when_training(c, "kill torchrun", lambda c: seen.update(out=c.exec(second, watch)))
            ],
        )
        code, out = seen["out"]
        assert code == 0, out
        assert "pid 1: tini -- entrypoint run" in out
        assert re.search(r"launcher's parent: .*/entrypoint run .* whose parent is pid 1\n", out)
        assert "workers: 2" in out, out
        assert "after: []" in out, out
        assert run.exit_codes == {first: 137, second: 137}, run.log(80)
        assert "killing 2 process(es) left behind by the launcher" in run.node(second).log()
        assert (
            f"stopping every node (exit 137): node 1 ({second}): the launcher (python3 -m "
            "torch.distributed.run) was killed by SIGKILL"
        ) in run.node(first).log()
        seconds = max(took(run, n, "kill torchrun") for n in (first, second))
        assert seconds < BOUND
        assert_no_secret(run.log())
        gone = float(out.rsplit("workers alive ", 1)[1].split(" s after")[0])
        measured("killed launcher: its workers gone", gone)
        measured("killed launcher: both exited 137", seconds)


def one_shot(client, image: str, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """`docker run --rm IMAGE ARGS`: (exit code, stdout and stderr)."""
    container = client.containers.run(
        image, args, environment=env, detach=True, labels={LABEL: "test-faults"}
    )
    try:
        code = container.wait(timeout=120)["StatusCode"]
        return code, container.logs(stdout=True, stderr=True).decode()
    finally:
        container.remove(force=True)


# A user's trainer whose failing rank prints the token it was given (a library quoting a URL
# with credentials), started with the secret on its command line too.
SCRIPT = (
    'if [ "$RANK" = 3 ]; then echo "auth failed for token $HF_TOKEN and $MY_SECRET, '
    'args $*" >&2; exit 3; fi; sleep 5'
)
LEAKY = (
    "bash",
    "-c",
    SCRIPT,
    "trainer",
    f"--token={SECRETS['HF_TOKEN']}",
    f"--password={SECRETS['DB_PASSWORD']}",
)


def test_secret_values_never_appear_in_plan_logs_or_the_printed_command(image, docker_client):
    """HF_TOKEN, WANDB_API_KEY and any variable named like *TOKEN*, *SECRET*, *PASSWORD*, *KEY*:
    their values are masked in `plan`, `plan --json`, `doctor`, `doctor --json`, the launch
    command each node prints, the trainer's stderr that the entrypoint relays, and node 0's
    failure summary. (Image layers: tests/image/test_layers.py.)"""
    env = SECRETS | {
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "node-0",
        "ENTRYPOINT_GPUS_PER_NODE": "0",
    }
    for args in (["plan", "--", *LEAKY], ["plan", "--json", "--", *LEAKY]):
        code, out = one_shot(docker_client, image, args, env)
        assert code == 0 and "--token=***" in out, out
        assert_no_secret(out)
    for args in (["doctor"], ["doctor", "--json"]):  # 1: node-0 does not resolve here
        code, out = one_shot(docker_client, image, args, env)
        assert code in (0, 1) and "MASTER_ADDR" in out, out
        assert_no_secret(out)
    with FaultyCluster(image, client=docker_client, echo=print) as c:
        first, second = c.hostname("node", 0), c.hostname("node", 1)
        run = c.run(
            [Node(n.name, n.env, command=["run", "--", *LEAKY]) for n in nodes(c)],
            timeout=TIMEOUT,
            grace=90,
        )
        # rank 3's own code, on both (torchrun itself exits 1)
        assert run.exit_codes == {first: 3, second: 3}, run.log(80)
        assert "--token=*** --password=***" in run.node(first).log()  # the printed command
        assert (
            "auth failed for token *** and ***, args --token=*** --password=***"
            in run.node(second).log()
        )  # relayed by node 1
        summary = run.node(first).log().split("worker failed: rank 3", 1)[1]
        assert "auth failed for token ***" in summary  # shown once at node 0, masked
        assert_no_secret(run.log())


# -- issue 16: the supervisor under faults, in containers -----------------------------------------

# Ranks 0-2 wait, saying which signal reached them; rank 3 aborts (as XLA and NCCL do on a fatal
# error) after 8 s. Plain processes under torchrun: no collective, so nothing but the
# entrypoints tells the healthy ranks.
ABORTER = (
    "import os, signal, sys, time\n"
    "rank = int(os.environ['RANK'])\n"
    "def on(sig, _):\n"
    "    print(f'rank {rank} got {signal.Signals(sig).name}', flush=True)\n"
    "    sys.exit(128 + sig)\n"
    "if rank != 3:\n"
    "    for s in (signal.SIGTERM, signal.SIGABRT, signal.SIGSEGV, signal.SIGINT):\n"
    "        signal.signal(s, on)\n"
    "print(f'rank {rank} waits', flush=True)\n"
    "time.sleep(8 if rank == 3 else 600)\n"
    "print('rank 3 aborts', flush=True)\n"
    "os.abort()\n"
)


def test_a_rank_that_aborts_is_a_failure_not_a_signal(image, docker_client):
    """os.abort() on rank 3 (exit 134): both containers exit 134, node 0 names rank 3 with exit
    code 134, and the healthy ranks get SIGTERM, never SIGABRT (issue 16: every healthy rank
    was sent SIGABRT and dumped core)."""
    with FaultyCluster(image, client=docker_client, echo=print) as c:
        first, second = c.hostname("node", 0), c.hostname("node", 1)
        run = c.run(
            [Node(n.name, n.env, command=["run", "--", "python", "-c", ABORTER]) for n in nodes(c)],
            timeout=TIMEOUT,
            grace=90,
        )
        assert run.exit_codes == {first: 134, second: 134}, run.log(80)
        log0, log1 = run.node(first).log(), run.node(second).log()
        assert "worker failed: rank 3 on node 1" in log0 and "exit code 134" in log0
        assert "rank 0 got SIGTERM" in log0 and "rank 1 got SIGTERM" in log0
        assert "rank 2 got SIGTERM" in log1 and "got SIGABRT" not in log0 + log1
        aborted = run.node(second).when("rank 3 aborts")
        seconds = max(run.node(n).ended for n in (first, second)) - aborted
        assert seconds < BOUND
        measured("a rank aborts: both exited 134", seconds)


def test_sigterm_while_a_node_waits_for_node_0_ends_it_at_once(image, docker_client):
    """Node 0 never starts; node 1 waits for it (ENTRYPOINT_JOIN_TIMEOUT, 300 s by default) and
    is sent SIGTERM (Kubernetes deletes the pod): it exits 143 at once, well before the
    platform's SIGKILL (issue 16: the wait ignored it, exit 75 at the join timeout)."""
    with FaultyCluster(image, client=docker_client, echo=print) as c:
        second = c.hostname("node", 1)
        (node1,) = [n for n in nodes(c, ENTRYPOINT_LOG_ALL_NODES="true") if n.name == second]
        term = Fault(
            "term",
            lambda c: c.kill(second, "SIGTERM"),
            node=second,
            line='"event": "start"',
            delay=3,
        )
        run = c.run([node1], timeout=TIMEOUT, grace=30, faults=[term])
        assert run.exit_codes == {second: 143}, run.log(80)
        assert "received SIGTERM while waiting for node 0" in run.node(second).log()
        seconds = took(run, second, "term")
        assert seconds < 10
        measured("SIGTERM while waiting for node 0: exited 143", seconds)
