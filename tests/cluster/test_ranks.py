"""Every rank watched across real node containers: two containers of the image with a container
platform's variables (WORLD_SIZE, RANK, MASTER_ADDR), 2 gloo ranks each, torch's DDP tutorial
loop with one rank misbehaving (tests/hang_trainer.py, mounted read-only as a user's code; no
change to it): a rank that sleeps at step 20 is named with its stack on node 0 and every node
exits 124 within 90 s of the hang; a rank every step waits for is named as slow in the log and in
`entrypoint status`. The same for JAX's processes (tests/jax_hang_trainer.py): a sleeping one
among 2 a node (torchrun starts them) is named, a pause and a first compilation longer than the
timeout raise nothing, a slow one is named (one a node, the JAX launcher). The loopback
versions, and the learned timeout with no setting at all, are in tests/unit/test_hang_real.py;
the Hugging Face Trainer, accelerate and FSDP2 cases in tests/compat/test_compat.py."""

from __future__ import annotations

import re
from pathlib import Path

from cluster.test_cluster import commercial
from entrypoint.local.cluster import Node
from faulty_cluster import Fault, FaultyCluster

TESTS = str(Path(__file__).parents[1])
TIMEOUT = 300


def nodes(c: FaultyCluster, **env: str) -> list[Node]:
    return [
        Node(n.name, dict(n.env) | env, command=("run", "--", "python", "/tests/hang_trainer.py"))
        for n in commercial(c)
    ]


def test_a_sleeping_rank_is_named_with_its_stack_and_every_node_exits(image, docker_client):
    with FaultyCluster(image, client=docker_client, echo=print, mounts={TESTS: "/tests"}) as c:
        run = c.run(
            nodes(c, ENTRYPOINT_HANG_TIMEOUT="30", HANG_RANK="3", HANG_STEP="20", STEPS="100000"),
            timeout=TIMEOUT,
        )
        codes = [n.exit_code for n in run.nodes]
        assert codes == [124, 124], run.log(60)
        node0 = run.nodes[0]
        line = next(x for x in node0.lines if "stopping every node (exit 124)" in x)
        assert "rank 3 on node 1" in line and "hang_trainer.py:" in line, line
        assert "time.sleep(3600)" in line, line
        assert re.search(r"Flight Recorder: rank 3 never entered collective #\d+ \(gloo:", line)
        # The hang began at rank 3's 20th step; every node has exited within 90 s of it.
        hung = node0.when("rank 0 training")
        assert hung is not None
        ended = max(n.ended or 0 for n in run.nodes)
        print(
            f"MEASURED hung rank, ENTRYPOINT_HANG_TIMEOUT=30: every node out "
            f"{ended - hung:.1f} s after training began (the hang is at step 20, ~2 s in)"
        )
        assert ended - hung < 90 + 5, run.log(60)


JAX_TRAINER = ("python", "/tests/jax_hang_trainer.py")
HUNG_PROCESS_1 = {"ENTRYPOINT_HANG_TIMEOUT": "30", "HANG_PROCESS": "1", "STEPS": "100000"}


def jax_nodes(c: FaultyCluster, **env: str) -> list[Node]:
    """The same platform's variables, the JAX launcher (one process per node) and JAX's
    multi-process guide with a loop of pmap'd steps (tests/jax_hang_trainer.py): nothing in it
    says a step is done."""
    return [
        Node(
            n.name,
            {k: v for k, v in n.env.items() if k != "ENTRYPOINT_NPROC_PER_NODE"}
            | {"ENTRYPOINT_LAUNCHER": "jax"}
            | env,
            command=("run", "--", *JAX_TRAINER),
        )
        for n in commercial(c)
    ]


def test_a_jax_process_that_sleeps_is_named_with_its_stack_and_every_node_exits(
    image, docker_client
):
    """2 JAX processes a node, started by the default launcher (torchrun, 2 CPU workers a node:
    JAX's values from its variables, trainer_side/jax_cluster.py); process 1, on node 0, sleeps
    at step 20."""
    with FaultyCluster(image, client=docker_client, echo=print, mounts={TESTS: "/tests"}) as c:
        run = c.run(
            [
                Node(n.name, dict(n.env) | HUNG_PROCESS_1, command=("run", "--", *JAX_TRAINER))
                for n in commercial(c)
            ],
            timeout=TIMEOUT,
        )
        assert [n.exit_code for n in run.nodes] == [124, 124], run.log(60)
        node0 = run.nodes[0]
        assert any("4 processes (torchrun's WORLD_SIZE)" in x for x in node0.lines), run.log(60)
        line = next(x for x in node0.lines if "stopping every node (exit 124)" in x)
        assert "rank 1 on node 0" in line and "jax_hang_trainer.py:" in line, line
        assert "time.sleep(3600)" in line, line
        # the others wait inside JAX: in the step's call, or in the next operation behind it
        assert re.search(r"ranks? [0-9, -]+ waits? in (wrapped|apply_primitive) \(jax/", line), line
        hung = node0.when("process 0 of 4 training")
        assert hung is not None
        ended = max(n.ended or 0 for n in run.nodes)
        print(
            f"MEASURED hung JAX process, ENTRYPOINT_HANG_TIMEOUT=30: every node out "
            f"{ended - hung:.1f} s after training began (the hang is at step 20, ~2 s in)"
        )
        assert ended - hung < 90 + 5, run.log(60)


def test_a_jax_pause_and_a_first_compilation_longer_than_the_timeout_raise_nothing(
    image, docker_client
):
    """The first step compiles for 35 s on every process, then process 0 pauses 20 s at step
    20, both with a 30 s hang timeout: no step is counted before the first compiled call
    returns, and the pause is shorter than the timeout."""
    with FaultyCluster(image, client=docker_client, echo=print, mounts={TESTS: "/tests"}) as c:
        run = c.run(
            jax_nodes(
                c,
                ENTRYPOINT_HANG_TIMEOUT="30",
                COMPILE_SECONDS="35",
                HANG_PROCESS="0",
                HANG_KIND="pause",
                HANG_SECONDS="20",
                STEPS="40",
            ),
            timeout=TIMEOUT,
        )
        run.check()
        logs = "\n".join(x for n in run.nodes for x in n.lines)
        assert "has not stepped" not in logs and "process 1 done: 40 steps" in logs, run.log(60)


def slow_run(image, docker_client, make_nodes, **env: str) -> tuple[list[str], dict[str, str]]:
    """A job with one slow rank, `ENTRYPOINT_SLOW_NODE_WINDOW=10`: node 0's "is slow" lines, and
    `entrypoint status --once` on node 0 once the first one came ({"out", "code"})."""
    status: dict[str, str] = {}

    def look(c: FaultyCluster) -> None:
        code, out = c.exec(c.hostname("worker", 0), ["entrypoint", "status", "--once"])
        status["out"], status["code"] = out, str(code)

    with FaultyCluster(image, client=docker_client, echo=print, mounts={TESTS: "/tests"}) as c:
        run = c.run(
            make_nodes(
                c,
                ENTRYPOINT_SLOW_NODE_WINDOW="10",
                HANG_STEP="0",
                HANG_KIND="slow",
                HANG_SECONDS="0.25",
                **env,
            ),  # fmt: skip
            faults=[Fault("status", look, node=c.hostname("worker", 0), line="is slow")],
            timeout=TIMEOUT,
        )
        run.check()
        return [x for x in run.nodes[0].lines if "is slow" in x], status


def test_a_slow_rank_is_named_in_the_log_and_in_status(image, docker_client):
    slow, status = slow_run(image, docker_client, nodes, HANG_RANK="3", STEPS="140")
    assert len(slow) == 1 and "rank 3 on node 1" in slow[0], slow
    out = status.get("out", "")
    assert status.get("code") == "1" and "slow: rank 3 on node 1" in out, status
    assert re.search(r"^\s+3\s+1\s+\S+.*yes$", out, re.M), out
    assert not re.search(r"^\s+[012]\s+[01]\s+\S+.*yes$", out, re.M), out


def test_a_slow_jax_process_is_named_in_the_log_and_in_status(image, docker_client):
    """Process 1 sleeps 0.25 s before every step (its own work, outside JAX); process 0 waits for
    it inside JAX (its dispatch, or its next operation): named slow, and only it."""
    slow, status = slow_run(image, docker_client, jax_nodes, HANG_PROCESS="1", STEPS="120")
    assert len(slow) == 1 and "rank 1 on node 1" in slow[0], slow
    assert "of its own work" in slow[0], slow
    out = status.get("out", "")
    assert status.get("code") == "1" and "slow: rank 1 on node 1" in out, status
    assert re.search(r"^\s+1\s+1\s+\S+.*yes$", out, re.M), out
    assert not re.search(r"^\s+0\s+0\s+\S+.*yes$", out, re.M), out
