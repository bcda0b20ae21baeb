"""The control channel in real containers (issue 17): a stranger on the network, a node with a
wrong token and a node of another job cannot stop a job; and no false alarm at the 5 s
heartbeat timeout when every core is saturated or a node's entrypoint is stopped for a few
seconds. Kill, pause and cut-off at the same defaults are in tests/cluster/test_faults.py.

Each case is 2 node containers x 2 CPU workers (hand-started nodes) running tests/fault_trainer.py
(steps of 0.05 s in lockstep over TCP; no torch: the subject is the entrypoints' control
channel, not the trainer), every setting at its default. `pytest -s` prints `MEASURED` lines.
"""

from __future__ import annotations

import shutil
import subprocess

from entrypoint.local.cluster import Node
from faulty_cluster import LIGHT_MOUNT, ONE_PER_NODE, Fault, FaultyCluster, light_started

TIMEOUT = 360  # per cluster run: a start takes ~30 s on 2 idle cores, minutes when shared
TRAINING = "[fault] step 10/"
TOKEN = "9f1c3e5a7b2d4f608192a3b4c5d6e7f8"  # test-only; asserted absent from every log
WRONG = "5d1f8b2e9a07c4e6b3f0a9d28c7e1b54"  # random too: a token of low variety is refused first
CONTROL_PORT = 29501  # MASTER_PORT + 1


STRANGER = r"""
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
def conn():
    s = socket.create_connection((host, port), timeout=10)
    s.recv(4096)  # node 0's challenge
    return s
lines = [b"1\n", b'{"t":"hello","member":"x"}\n', b'{"t":"exit","code":0,"signal":128}\n',
         b"\xff" * 100 + b"\n", b"[" * 100000 + b"\n", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
         b'{"t":"hello","protocol":2,"member":1,"host":"evil","fingerprint":{}}\n']
for line in lines:
    s = conn()
    s.sendall(line)
    time.sleep(0.2)
    s.close()
flood = [conn() for _ in range(200)]  # more than node 0 keeps waiting for a hello
silent = conn()  # says nothing at all
time.sleep(2)
print("stranger done", flush=True)
"""


def test_a_stranger_on_the_network_cannot_stop_the_job(image, docker_client):
    """Issue 17's `1\\n` ended the server thread; now garbage, wrong types, a 100 kB nesting,
    an HTTP request, a forged exit, 200 connections at once and a silent one, sent to node 0's
    control port from another machine while the job trains, are dropped and logged with the
    stranger's address, and both nodes finish with exit 0."""
    with FaultyCluster(image, client=docker_client, echo=print, mounts=LIGHT_MOUNT) as c:
        first, second = c.hostname("node", 0), c.hostname("node", 1)
        seen: dict[str, tuple[int, str]] = {}
        stranger = ["python3", "-c", STRANGER, first, str(CONTROL_PORT)]
        run = c.run(
            light_started(
                c, 800, **ONE_PER_NODE
            ),  # 40 s: outlasts the stranger (about 4 s) on a loaded machine
            timeout=TIMEOUT,
            faults=[
                Fault(
                    "stranger",
                    lambda c: seen.update(out=c.exec(second, stranger)),
                    node=first,
                    line=TRAINING,
                )
            ],
        )
        assert seen["out"][0] == 0 and "stranger done" in seen["out"][1], seen
        assert run.exit_codes == {first: 0, second: 0}, run.log(80)
        log0 = run.node(first).log()
        assert "control port: dropped a connection from " in log0
        for why in (
            "a message is a JSON object, got int",
            "protocol missing",
            "signal must be an integer 1-127, got 128",
            "not JSON",
            "connections waiting for their hello",
        ):
            assert why in log0, why
        assert "lost node" not in log0


def test_a_wrong_token_or_another_jobs_node_is_refused_and_the_job_goes_on(image, docker_client):
    """Two more containers claim to be node 1: one with a wrong ENTRYPOINT_JOB_TOKEN, one of
    another job (ENTRYPOINT_JOB_ID) with the right token. Each is refused with one line on
    both sides naming it and the reason, exits 2, and the real nodes train and exit 0. The
    token never appears in a log."""
    with FaultyCluster(image, client=docker_client, echo=print, mounts=LIGHT_MOUNT) as c:
        first, second = c.hostname("node", 0), c.hostname("node", 1)
        wrong, other = c.hostname("wrongtoken", 1), c.hostname("otherjob", 1)
        job = {"ENTRYPOINT_JOB_ID": "train-42", "ENTRYPOINT_JOB_TOKEN": TOKEN}
        real = light_started(
            c, 600, **ONE_PER_NODE, **job
        )  # 30 s: outlasts the intruders' start at 5 s
        intruders = [
            Node(wrong, real[1].env | {"ENTRYPOINT_JOB_TOKEN": WRONG}, delay=5),
            Node(other, real[1].env | {"ENTRYPOINT_JOB_ID": "train-41"}, delay=5),
        ]
        run = c.run(real + intruders, timeout=TIMEOUT, grace=TIMEOUT)
        assert run.exit_codes == {first: 0, second: 0, wrong: 2, other: 2}, run.log(80)
        log0 = run.node(first).log()
        for name, why in (
            (wrong, "wrong job token: its ENTRYPOINT_JOB_TOKEN is not node 0's"),
            (
                other,
                (
                    "it belongs to another job: ENTRYPOINT_JOB_ID=train-41 "
                    "there, ENTRYPOINT_JOB_ID=train-42 on node 0"
                ),
            ),
        ):
            assert f"refused node 1 ({name}, " in log0 and why in log0, log0[-3000:]
            own = run.node(name).log()
            assert f"node 0 refused node 1 ({name}, " in own and why in own, own[-2000:]
        assert TOKEN not in run.log() and WRONG not in run.log()


def test_no_false_alarm_when_every_core_is_saturated(image, docker_client, unavailable):
    """stress-ng on every core of this machine (the containers share them) while the job
    trains: the entrypoints' heartbeats still come within the 5 s timeout; both exit 0."""
    if shutil.which("stress-ng") is None:
        unavailable("stress-ng is not installed (apt-get install stress-ng; .ci/run does)")
    stress: list[subprocess.Popen] = []

    def saturate(c: FaultyCluster) -> None:
        stress.append(
            subprocess.Popen(
                [
                    "stress-ng",
                    "--cpu",
                    "0",
                    "--cpu-method",
                    "matrixprod",
                    "--timeout",
                    "45s",
                    "--quiet",
                ]
            )
        )

    try:
        with FaultyCluster(image, client=docker_client, echo=print, mounts=LIGHT_MOUNT) as c:
            first, second = c.hostname("node", 0), c.hostname("node", 1)
            run = c.run(
                light_started(c, 300, **ONE_PER_NODE),  # 15 s of stepping under stress-ng's 45 s
                timeout=TIMEOUT,
                faults=[Fault("stress-ng", saturate, node=first, line=TRAINING)],
            )
            assert stress, "stress-ng never started"
            assert run.exit_codes == {first: 0, second: 0}, run.log(80)
            assert "lost node" not in run.log() and "silent for" not in run.log()
            print(
                f"MEASURED saturated cores: trained under stress-ng for "
                f"{run.node(first).ended - run.faults['stress-ng']:.1f} s, no false alarm"
            )
    finally:
        for proc in stress:
            proc.kill()
            proc.wait()


STOP_ENTRYPOINT = r"""
import os, signal, sys, time
def cmd(p):
    try:
        return open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""
pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())
           and "entrypoint run" in cmd(p))
os.kill(pid, signal.SIGSTOP)
time.sleep(float(sys.argv[1]))
os.kill(pid, signal.SIGCONT)
print("stopped", pid, "for", sys.argv[1], "s", flush=True)
"""


def test_no_false_alarm_when_an_entrypoint_is_stopped_briefly(image, docker_client):
    """SIGSTOP, then SIGCONT 3 s later, of node 1's entrypoint, then of node 0's (a stall of
    the scheduler, a slow NFS read): shorter than the 5 s timeout less one interval, so no
    node is named lost and both exit 0."""
    with FaultyCluster(image, client=docker_client, echo=print, mounts=LIGHT_MOUNT) as c:
        first, second = c.hostname("node", 0), c.hostname("node", 1)
        out: dict[str, tuple[int, str]] = {}

        def stop(name: str):
            return lambda c: out.update(
                {name: c.exec(name, ["python3", "-c", STOP_ENTRYPOINT, "3"])}
            )

        run = c.run(
            light_started(
                c, 400, **ONE_PER_NODE
            ),  # 20 s: outlasts both 3 s stops on a loaded machine
            timeout=TIMEOUT,
            faults=[
                Fault("stop node 1", stop(second), node=first, line=TRAINING),
                Fault("stop node 0", stop(first), node=first, line=TRAINING, delay=5),
            ],
        )
        assert all(code == 0 and "stopped" in text for code, text in out.values()), out
        assert len(out) == 2, (out, run.fault_errors)
        assert run.exit_codes == {first: 0, second: 0}, run.log(80)
        assert "lost node" not in run.log() and "silent for" not in run.log()
