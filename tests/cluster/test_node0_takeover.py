"""Losing node 0 across real containers (issue 50): 3 node containers of the image (2 workers
each, through torchrun, hand-started with a spare), no etcd named: the job's own etcd runs on
its 3 nodes (the image's etcd, started by each entrypoint). Node 0 is `docker kill`ed, or cut
off by `docker network disconnect`, while the job trains: a survivor takes its seat in etcd,
serves the job, and every rank trains again in one world with the trainers' rendezvous on the
new node 0's host (MASTER_ADDR moved), resumed from the checkpoint on the shared volume. The
killed node 0's container is started again after the takeover, as its platform would: it knows
no survivor and not where etcd is, the new node 0 knocks at its address, and it joins as a
standby and ends with the job; then the third node is killed and started again, joins node 0's
address, is told there who holds the seat, and stands by too (that second loss takes etcd's
quorum: the new node 0 goes on without its seat, and says so). The cut-off node 0 cannot renew
its seat (its etcd member is alone): it kills its trainers and exits 75 before its seat could
be taken. After the takeover, `entrypoint status` on node 2 finds the new node 0 from node 1's
host (node 0's port, or a node's that points at it) and with no address at all (MASTER_ADDR
names the lost node 0).

The workers run tests/fault_trainer.py (the entrypoint's handling is the subject, and its
collective is served by rank 0 at MASTER_ADDR: a rank left on the old master would not step).
The same on loopback, with more cases: tests/unit/test_node0_takeover_real.py."""

from __future__ import annotations

import json
import time

import pytest

from faulty_cluster import Fault, FaultyCluster, lightened

from .test_spares import OUTPUT, TIMEOUT, at_step, cluster, measured, nodes

TOKEN = "takeover-token-0123456789abcdef"
# how node 0 is lost, and its container's last exit code: killed, it is started again by its
# platform after the takeover (it joins the new node 0 as a standby, and ends with the job)
SEATED = "node 0's seat is in the job's own etcd"
FAULTS = {"kill": (FaultyCluster.kill, 0), "disconnect": (FaultyCluster.disconnect, 75)}


@pytest.mark.parametrize("fault", FAULTS)
def test_node_0_lost_a_survivor_takes_its_seat_and_every_rank_trains_again(
    image, docker_client, fault
):
    act, code = FAULTS[fault]
    with cluster(image, docker_client) as c:
        n = [c.hostname("node", r) for r in range(3)]
        steps = 600 if fault == "kill" else 300
        job = nodes(
            c,
            3,
            ENTRYPOINT_SPARES="1",
            ENTRYPOINT_JOB_TOKEN=TOKEN,
            ENTRYPOINT_JOIN_TIMEOUT="120",
        )
        asked: dict[str, tuple[int, str]] = {}

        def status(c: FaultyCluster) -> None:
            """From node 2: `entrypoint status` of node 1's host (the new node 0, or its
            signpost to it), and with no address (MASTER_ADDR names the lost node 0)."""
            for name, words in (("node 1", [n[1]]), ("no address", [])):
                asked[name] = c.exec(n[2], ["entrypoint", "status", "--json", *words])

        lost: list[float] = []

        def lose0(c: FaultyCluster) -> None:
            end = c.seconds() + 60
            while not any("[fault] step 25/" in x for x in c.live[n[0]].lines):
                assert c.seconds() < end, "node 0's rank 0 did not reach step 25 in 60 s"
                time.sleep(0.1)
            lost.append(c.seconds())
            act(c, n[0])

        def again(c: FaultyCluster) -> None:
            c.start_again(n[0])

        def cycled(c: FaultyCluster) -> None:
            """Once node 0 stands by: the node that is neither node 0 nor the seat's holder is
            killed and, once the job went on without it (restart 2), started again: it joins
            node 0's address, which tells it who holds the seat."""
            said = [x for name in n[1:] for x in c.live[name].lines if "is node 0 from" in x]
            holder = n[int(said[0].split("lost; node ")[1].split()[0])]
            victim = n[2] if holder == n[1] else n[1]
            c.kill(victim)
            end = c.seconds() + 90
            while not any("(restart 2)" in x for x in c.live[holder].lines):
                assert c.seconds() < end, "no restart 2 within 90 s"
                time.sleep(0.2)
            c.start_again(victim)
            cycle.append(victim)

        cycle: list[str] = []

        run = c.run(
            lightened(job, steps, out=f"{OUTPUT}/results"),
            timeout=TIMEOUT,
            grace=float("inf"),
            faults=[
                # once node 0 holds its seat (a node 0 lost before then ends the job, as it
                # did before the takeover existed), and past step 20's checkpoint
                at_step(c, "lose0", lose0, line=SEATED),
                Fault("status", status, node=n[2], line="(restart 1)", delay=1),
                *(  # after `status` saw node 0 lost (degraded)
                    [
                        Fault("again", again, node=n[2], line="(restart 1)", delay=6),
                        Fault("cycled", cycled, node=n[0], line="standing by"),
                    ]
                    if fault == "kill"
                    else []
                ),
            ],
        )
        assert run.exit_codes == {n[0]: code, n[1]: 0, n[2]: 0}, run.log(120)
        log0 = run.node(n[0]).log()
        assert (
            "losing node 0 costs a restart, not the job: node 0's seat is in the job's own etcd"
            in log0
        )
        lines = [x for name in n[1:] for x in run.node(name).log().splitlines()]
        (said,) = {x.split('"event": "')[1].split('"')[0] for x in lines if "is node 0 from" in x}
        assert said.startswith(f"node 0 ({n[0]}) lost; node ") and "from restart 1" in said, said
        new = n[int(said.split("lost; node ")[1].split()[0])]
        assert f"({new}) is node 0" in said, said
        # the last start: every rank of a world of 4, from the checkpoint, to the end, with its
        # rendezvous (MASTER_ADDR, and the trainer's collective there) on the new node 0
        final = 2 if fault == "kill" else 1
        last = sorted(
            (r for r in run.node(new).results if r["restart"] == final), key=lambda r: r["rank"]
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
        assert set(asked) == {"node 1", "no address"}, run.fault_errors
        for name, (code, out) in asked.items():  # degraded: node 0 is lost
            assert code == 1, (name, code, out)
            job_seen = json.loads(out.splitlines()[-1])
            assert len(job_seen["nodes"]) >= 2, (name, job_seen)
        back = run.node(new).when("(restart 1)")
        assert lost, run.fault_errors
        lost_at = lost[0]
        assert back is not None, run.log(80)
        measured(f"node 0 {fault}: a survivor node 0, every rank training again", back - lost_at)
        if fault == "kill":  # started again: it knows no survivor, and not where etcd is
            assert "again" in run.faults, run.fault_errors
            assert (
                "(it knocked at this node's control port): this node, started again, joins it"
                in log0
            ), log0[-3000:]
            assert "standing by" in log0.split("started again, joins it")[1], log0[-3000:]
            (victim,) = cycle or [None]  # started again after restart 2: node 0's port told it
            assert victim is not None, run.fault_errors
            seen = run.node(victim).log()
            assert f"(node 0's address {n[0]} says so): this node, started again" in seen, seen
            held = run.node(new).log()
            assert f"node {n.index(victim)} ({victim}) joined as a standby" in held, held[-3000:]
            assert "so no node can take node 0's seat: the job goes on" in held, held[-3000:]
        if fault == "disconnect":  # fenced: its trainers stopped before a new node 0 trained
            fenced = run.node(n[0]).when("this node lost node 0's seat in etcd")
            assert fenced is not None and fenced < back, (fenced, back, log0[-4000:])
            measured("node 0 cut off: its trainers stopped, it is out", fenced - lost_at)
