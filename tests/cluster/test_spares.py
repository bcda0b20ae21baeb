"""Spares and shrinking in real containers (issue 22): node containers of the image training the
built-in DeepSpeed job (2 CPU workers each, hand-started: NNODES counts the spares too, as a
platform's own variables do), checkpoints on a shared volume, and a node killed or paused while
the job trains. A lost node costs a restart from the last checkpoint, not the job.

The same with processes on loopback, without Docker: tests/unit/test_spares_real.py. The times
of a takeover and a shrink are printed (`MEASURED ...`, with -s); `benchmarks/spares.py` takes
the figures.
"""

from __future__ import annotations

from entrypoint.local.cluster import Node
from faulty_cluster import LIGHT_MOUNT, Fault, FaultyCluster, FaultyRun, lightened

from .test_preflight import TwoImages, odd_image  # noqa: F401 - a fixture

STEPS = 90  # ~15 s of training on 2 idle cores; checkpoints every 10 steps
SHARED = "/shared"
OUTPUT = f"{SHARED}/job"
TIMEOUT = 420
TRAINING = "job] step 20/"  # [job] or [jax job]: after the checkpoint of step 20
RESUMED = "job] resuming from checkpoint"


def nodes(c, n: int, steps: int = STEPS, workers: str | None = "2", **env: str) -> list[Node]:
    master = c.hostname("node", 0)
    return [
        Node(
            c.hostname("node", r),
            {
                "NNODES": str(n),
                "NODE_RANK": str(r),
                "MASTER_ADDR": master,
                "MASTER_PORT": "29500",
                **({"ENTRYPOINT_NPROC_PER_NODE": workers} if workers else {}),
                "ENTRYPOINT_JOB_STEPS": str(steps),
                "ENTRYPOINT_JOB_LOG_EVERY": "5",
                "ENTRYPOINT_JOB_SAVE_EVERY": "10",
                "ENTRYPOINT_JOB_OUTPUT": OUTPUT,
            }
            | env,
        )
        for r in range(n)
    ]


def cluster(image, docker_client) -> FaultyCluster:
    return FaultyCluster(
        image,
        client=docker_client,
        echo=print,
        shared=SHARED,
        output=OUTPUT,
        mounts=LIGHT_MOUNT,
    )


def at_step(c: FaultyCluster, name: str, action, line: str = TRAINING, delay: float = 0) -> Fault:
    return Fault(name, action, node=c.hostname("node", 0), line=line, delay=delay)


def finished(run: FaultyRun, trained_on: list[str], world: int, steps: int = STEPS) -> None:
    """Every worker of the last start reported the last step, resumed from a checkpoint."""
    reports = [r for name in trained_on for r in run.node(name).results]
    assert sorted(r["rank"] for r in reports) == list(range(world)), run.log(60)
    assert {(r["world_size"], r["steps"]) for r in reports} == {(world, steps)}, reports
    assert all(r["resumed_from"] for r in reports), reports


def measured(case: str, seconds: float) -> None:
    print(f"MEASURED {case}: {seconds:.1f} s")


def test_spares_take_the_ranks_of_two_nodes_killed_in_a_row(image, docker_client):
    """2 nodes + 2 spares: node 1 killed, spare 2 takes rank 1; once training again, node 2
    killed, spare 3 takes rank 1; the job finishes every step, exit 0 on the nodes alive. The
    nodes run tests/fault_trainer.py, its checkpoint on the shared volume: the spares'
    bookkeeping over two takeovers is the subject; the built-in job's resume after a takeover
    is test_a_paused_node_is_replaced_by_a_spare's."""
    with cluster(image, docker_client) as c:
        n = [c.hostname("node", r) for r in range(4)]
        steps = 300  # still training at the second kill
        run = c.run(
            lightened(nodes(c, 4, ENTRYPOINT_SPARES="2"), steps, out=f"{OUTPUT}/results"),
            timeout=TIMEOUT,
            grace=float("inf"),
            faults=[
                at_step(c, "kill1", lambda c: c.kill(n[1]), line="[fault] step 20/"),
                at_step(c, "kill2", lambda c: c.kill(n[2]), line="(restart 1)", delay=3),
            ],
        )
        assert run.exit_codes == {n[0]: 0, n[1]: 137, n[2]: 137, n[3]: 0}, run.log(80)
        log = run.node(n[0]).log()
        assert "training on 2 of 2 nodes; 2 standby (2, 3)" in log
        assert "restart 1: node 2 takes node rank 1; training on 2 of 2 nodes; 1 standby" in log
        assert "restart 2: node 3 takes node rank 1; training on 2 of 2 nodes; 0 standby" in log
        # the last start's reports, on the shared volume: every rank, resumed, to the end
        last = sorted(run.node(n[0]).results, key=lambda r: r["rank"])
        assert [r["rank"] for r in last] == [0, 1, 2, 3], last
        assert all(
            (r["world_size"], r["restart"], r["last_step"]) == (4, 2, steps) and r["start"] >= 20
            for r in last
        ), last
        node0 = run.node(n[0])
        called = node0.when("(restart 1)")  # node 0's line: the go of restart 1
        back = next(
            (t for line, t in zip(node0.lines, node0.times, strict=False)
             if "starts at step" in line and "(restart 1)" in line),
            None,
        )  # fmt: skip
        assert called is not None and back is not None
        measured(
            "spare took a killed node's rank: node 0's trainer started again, its checkpoint read",
            back - run.faults["kill1"],
        )


def test_a_paused_node_is_replaced_by_a_spare(image, docker_client):
    """`docker pause` of node 1: silent past the heartbeat timeout, its rank goes to the spare;
    unpaused once node 0 finished, it finds its channel closed and stops, 75."""
    with cluster(image, docker_client) as c:
        n = [c.hostname("node", r) for r in range(3)]
        run = c.run(
            nodes(c, 3, ENTRYPOINT_SPARES="1"),
            timeout=TIMEOUT,
            grace=float("inf"),
            faults=[
                at_step(c, "pause", lambda c: c.pause(n[1])),
                Fault("unpause", lambda c: c.unpause(n[1]), exited=n[0]),
            ],
        )
        assert run.exit_codes == {n[0]: 0, n[1]: 75, n[2]: 0}, run.log(80)
        assert "lost node 1" in run.node(n[0]).log() and "silent for" in run.node(n[0]).log()
        finished(run, [n[0], n[2]], 4)


def test_with_min_nodes_the_job_shrinks_and_resumes_at_the_smaller_world_size(image, docker_client):
    """3 nodes, ENTRYPOINT_MIN_NODES=2, node 1 killed: node 2 moves to rank 1, the job resumes
    the checkpoint written by 6 workers with 4 (weights and step; Adam starts afresh), keeps its
    global batch (the config's split gives the accumulation) and finishes."""
    with cluster(image, docker_client) as c:
        n = [c.hostname("node", r) for r in range(3)]
        run = c.run(
            nodes(c, 3, ENTRYPOINT_MIN_NODES="2"),
            timeout=TIMEOUT,
            grace=float("inf"),
            faults=[at_step(c, "kill", lambda c: c.kill(n[1]))],
        )
        assert run.exit_codes == {n[0]: 0, n[1]: 137, n[2]: 0}, run.log(80)
        assert (
            "node 2 moves from node rank 2 to 1; training on 2 of 3 nodes" in run.node(n[0]).log()
        )
        assert "written by 6 workers, this job has 4" in run.node(n[0]).log()
        finished(run, [n[0], n[2]], 4)
        batches = {r["global_batch"] for name in (n[0], n[2]) for r in run.node(name).results}
        assert len(batches) == 1, batches
        back = run.node(n[0]).when(RESUMED)
        assert back is not None
        measured("shrunk onto 2 nodes: node 0 training again", back - run.faults["kill"])


def test_a_lost_standby_is_logged_and_node_0_lost_ends_the_job(image, docker_client):
    """2 nodes + 2 spares, ENTRYPOINT_ETCD=off (no etcd, not even the job's own): spare 3
    killed, the job goes on; then node 0 killed: the others stop, 75, naming it (node 0 serves
    the channel and the rendezvous). With the job's own etcd a survivor takes node 0's place:
    test_node0_takeover.py. The nodes run tests/fault_trainer.py: no checkpoint is resumed
    here, the entrypoints are the subject."""
    with cluster(image, docker_client) as c:
        n = [c.hostname("node", r) for r in range(4)]
        run = c.run(
            lightened(nodes(c, 4, ENTRYPOINT_SPARES="2", ENTRYPOINT_ETCD="off"), 5000),
            timeout=TIMEOUT,
            grace=90,
            faults=[
                at_step(c, "kill3", lambda c: c.kill(n[3]), line="[fault] step 20/"),
                at_step(c, "kill0", lambda c: c.kill(n[0]), line="lost standby node 3", delay=2),
            ],
        )
        assert run.exit_codes == {n[0]: 137, n[1]: 75, n[2]: 75, n[3]: 137}, run.log(80)
        log0 = run.node(n[0]).log()
        assert "[fault] step" in log0.split("lost standby node 3", 1)[1], log0[-2000:]  # went on
        assert "losing node 0 ends this job: ENTRYPOINT_ETCD=off" in log0, log0[-2000:]
        for name in (n[1], n[2]):
            assert "lost node 0" in run.node(name).log(), run.node(name).log()[-2000:]


def test_a_spare_of_another_image_is_refused_at_the_start_and_the_job_trains(
    image,
    odd_image,  # noqa: F811 - the fixture
    docker_client,
):
    """The refusal is the entrypoints' (node 0's check of a standby's packages), not the
    trainer's: the nodes run tests/fault_trainer.py, 200 steps (10 s), as long as the spare's
    start."""
    with TwoImages(image, {}, client=docker_client, echo=print, mounts=LIGHT_MOUNT) as c:
        specs = lightened(nodes(c, 3, ENTRYPOINT_SPARES="1"), 200)
        c.others = {specs[2].name: odd_image}
        run = c.run(specs, timeout=TIMEOUT, grace=float("inf"))
        n = [s.name for s in specs]
        assert run.exit_codes == {n[0]: 0, n[1]: 0, n[2]: 2}, run.log(60)
        refusal = "node 2 (" + n[2] + ") does not match node 0 and cannot stand by"
        assert refusal in run.node(n[0]).log() and "hjson 3.0.2 vs 3.1.0" in run.node(n[2]).log()


def test_the_jax_job_survives_a_spares_takeover_then_a_shrink(image, docker_client):
    """The built-in JAX job (one process per node), 3 nodes + 1 spare, ENTRYPOINT_MIN_NODES=2:
    node 1 killed, the spare takes rank 1; node 2 killed, the job shrinks onto 2 nodes and its
    replicated checkpoint carries over; it finishes every step."""
    with cluster(image, docker_client) as c:
        n = [c.hostname("node", r) for r in range(4)]
        specs = nodes(
            c,
            4,
            workers=None,
            ENTRYPOINT_SPARES="1",
            ENTRYPOINT_MIN_NODES="2",
            ENTRYPOINT_JOB="jax",
        )
        run = c.run(
            specs,
            timeout=TIMEOUT,
            grace=float("inf"),
            faults=[
                at_step(c, "kill1", lambda c: c.kill(n[1])),
                at_step(c, "kill2", lambda c: c.kill(n[2]), line=RESUMED, delay=3),
            ],
        )
        assert run.exit_codes == {n[0]: 0, n[1]: 137, n[2]: 137, n[3]: 0}, run.log(80)
        log = run.node(n[0]).log()
        assert "restart 1: node 3 takes node rank 1" in log
        assert "restart 2: node 3 moves from node rank 1 to" not in log  # it keeps rank 1
        assert "training on 2 of 3 nodes" in log
        finished(run, [n[0], n[3]], 2)
