"""Losing node 0 across real containers (issue 50): 3 node containers of the image (2 workers
each, through torchrun, hand-started with a spare) and an etcd in a container of its own on the
same network (Debian's etcd binary, mounted: it needs only libc), `ENTRYPOINT_ETCD` pointing at
it. Node 0 is `docker kill`ed while the job trains: a survivor takes its seat in etcd, serves the
job, and every rank trains again in one world with the trainers' rendezvous on the new node 0's
host (MASTER_ADDR moved), resumed from the checkpoint on the shared volume.

The workers run tests/fault_trainer.py (the entrypoint's handling is the subject, and its
collective is served by rank 0 at MASTER_ADDR: a rank left on the old master would not step).
The same on loopback, with more cases: tests/unit/test_node0_takeover_real.py."""

from __future__ import annotations

from entrypoint.local.cluster import Node
from faulty_cluster import LIGHT_MOUNT, FaultyCluster, lightened

from .test_spares import OUTPUT, SHARED, TIMEOUT, at_step, measured, nodes

ETCD = "/opt/etcd/etcd"  # Debian's etcd-server binary, mounted read-only (`.ci/run` installs it)


def etcd_node(c: FaultyCluster) -> Node:
    name = c.hostname("etcd", 0)
    peer = "http://127.0.0.1:2380"
    return Node(
        name,
        {},
        command=[ETCD, "--name", "e", "--data-dir", "/tmp/etcd",
                 "--listen-client-urls", "http://0.0.0.0:2379",
                 "--advertise-client-urls", f"http://{name}:2379",
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"e={peer}"],
    )  # fmt: skip


def test_node_0_killed_a_survivor_takes_its_seat_and_every_rank_trains_again(image, docker_client):
    with FaultyCluster(
        image,
        client=docker_client,
        echo=print,
        shared=SHARED,
        output=OUTPUT,
        mounts=LIGHT_MOUNT | {"/usr/bin/etcd": ETCD},
    ) as c:
        etcd = etcd_node(c)
        c.start(etcd)
        n = [c.hostname("node", r) for r in range(3)]
        steps = 300
        job = nodes(
            c,
            3,
            ENTRYPOINT_SPARES="1",
            ENTRYPOINT_ETCD=f"http://{etcd.name}:2379",
            ENTRYPOINT_JOB_ID="takeover",
            ENTRYPOINT_JOIN_TIMEOUT="120",
        )
        run = c.run(
            lightened(job, steps, out=f"{OUTPUT}/results"),
            timeout=TIMEOUT,
            grace=float("inf"),
            faults=[at_step(c, "kill0", lambda c: c.kill(n[0]), line="[fault] step 20/")],
        )
        assert run.exit_codes == {n[0]: 137, n[1]: 0, n[2]: 0}, run.log(120)
        assert "losing node 0 costs a restart, not the job" in run.node(n[0]).log()
        lines = [x for name in n[1:] for x in run.node(name).log().splitlines()]
        (said,) = {x.split('"event": "')[1].split('"')[0] for x in lines if "is node 0 from" in x}
        assert said.startswith(f"node 0 ({n[0]}) lost; node ") and "from restart 1" in said, said
        new = n[int(said.split("lost; node ")[1].split()[0])]
        assert f"({new}) is node 0" in said, said
        # the last start: every rank of a world of 4, from the checkpoint, to the end, with its
        # rendezvous (MASTER_ADDR, and the trainer's collective there) on the new node 0
        last = sorted(
            (r for r in run.node(new).results if r["restart"] == 1), key=lambda r: r["rank"]
        )
        assert [(r["rank"], r["world_size"], r["last_step"]) for r in last] == [
            (rank, 4, steps) for rank in range(4)
        ], last
        assert all(r["start"] >= 20 for r in last), last
        other = run.node(n[2] if new == n[1] else n[1]).log()
        if new == n[2]:  # the spare won: node 1 keeps its rank, its rendezvous moves
            assert f"the trainer's rendezvous moves to the new node 0: {new}" in other, other
        else:  # node 1 won: it leaves rank 1 to the spare
            assert "node 0 seated this node in node rank 1 of 2 (it stood by)" in other, other
        back = run.node(new).when("(restart 1)")
        assert back is not None
        measured(
            "node 0 killed: a survivor node 0, every rank training again",
            back - run.faults["kill0"],
        )
