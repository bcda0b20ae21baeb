"""Losing node 0 with ENTRYPOINT_ETCD (issue 50): real `entrypoint run` nodes on loopback, a real
etcd (tests/unit/etcd_server.py), tests/fault_trainer.py one process a node (the entrypoint's
own control flow is the subject). Node 0 holds its seat in etcd and writes the job's record; when
it is killed, a survivor takes the seat over, serves the job from the record, the spare takes the
rank the new node 0 leaves, and every rank resumes from the checkpoint."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import time
from datetime import datetime

import pytest
from test_messages import FP
from test_spares_real import _checkpointed, _finished, _signal_tree
from test_supervise_real import ONE_PER_NODE, Nodes, nodes, started  # noqa: F401

from entrypoint.consensus import embedded
from entrypoint.consensus.election import Holder
from entrypoint.consensus.etcd import Etcd, EtcdRefused, EtcdUnreachable
from entrypoint.consensus.lease import TTL
from entrypoint.control.identity import Identity
from entrypoint.control.node_fingerprint import Fingerprint
from entrypoint.supervise.knock import Knocker
from tests.unit import etcd_server
from tests.unit.etcd_server import EtcdServer, Relay

STEPS = "160"
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


@pytest.fixture
def cluster(started, etcd):  # noqa: F811 - the fixture
    def make(n, job, **env):
        job_env = {"ENTRYPOINT_ETCD": _url(etcd.endpoint), "ENTRYPOINT_JOB_ID": job}
        return started(n, **{"FAULT_STEPS": STEPS} | job_env | ONE_PER_NODE | env)

    return make


def _events(log: str) -> list[str]:
    return [json.loads(x)["event"] for x in log.splitlines() if x.startswith("{")]


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """An etcd over https that asks for a client certificate, its auth on: the settings."""
    server, env = etcd_server.secured(tmp_path_factory.mktemp("etcd-tls"))
    yield env
    server.stop()


@pytest.mark.parametrize("access", ["http", "https, certificate, user"])
def test_node_0_killed_a_survivor_takes_its_seat_and_the_spare_trains(cluster, access, request):
    tls = request.getfixturevalue("secured") if access != "http" else {}
    c = cluster(3, f"takeover-spare-{len(tls)}", ENTRYPOINT_SPARES="1", **tls)
    _checkpointed(c, 2)
    assert "losing node 0 costs a restart, not the job" in c.log(0), c.log(0)[-3000:]
    killed, killed_at, said = _node_0_killed_and_the_job_done(c)
    for rank in (1, 2):
        assert any("electing a new node 0 through etcd" in x for x in said[rank]), said[rank]
    (line,) = {x for rank in (1, 2) for x in said[rank] if "is node 0 from restart 1" in x}
    # node 0's process ended, so it hung up on both survivors: its seat freed at once, not at
    # its lease's end
    seated = min(_said_at(c, rank, "is node 0 from restart 1") for rank in (1, 2)) - killed_at
    assert seated < TTL / 2, f"the seat taken {seated:.1f} s after the kill"
    assert line.startswith(f"node 0 ({HOST}) lost; node ") and f"({HOST}) is node 0" in line
    new = int(line.split("lost; node ")[1].split()[0])
    # the new node 0 speaks as node 0, and takes node rank 0 (the spare, if it won, stands by no
    # more; node 1, if it won, leaves rank 1 to the spare)
    assert any(x.startswith("restart 1: ") for x in said[new]), said[new]
    assert any(x.startswith("node 0 seated this node in node rank 0 of 2") for x in said[new])
    print(f"MEASURED node 0 killed: a survivor took its seat {seated:.1f} s later, the job "
          f"done in {time.monotonic() - killed:.1f} s")  # fmt: skip


TOKEN = "own-etcd-token-0123456789abcdef"
FILES = ("ca.crt", "peer.crt", "peer.key")  # a node's TLS files (embedded.job_tls)


def test_with_no_etcd_set_the_jobs_own_etcd_lets_a_survivor_take_node_0s_seat(started):  # noqa: F811
    """No ENTRYPOINT_ETCD: the job's first 3 nodes start its own etcd members (node 0 named them
    in its `go`), closed by the job's token (every port by TLS from the job's CA, clients by
    etcd's auth too); node 0 and its member are killed together, the two members left keep
    etcd's quorum, and a survivor takes the seat."""
    c = started(
        3, FAULT_STEPS=STEPS, ENTRYPOINT_SPARES="1", ENTRYPOINT_JOB_TOKEN=TOKEN, **ONE_PER_NODE
    )
    _checkpointed(c, 2)
    _own_etcd_holds_the_seat(c)
    assert "started member m0 of the job's etcd (3 members)" in c.log(0)
    assert f":{c.port + 4}" in c.log(0).split("peers at https://")[1]  # TLS from the token
    for rank in range(3):  # each member's own log, its certificate, and no CA key
        assert (c.tmp / "run" / f"node{rank}" / "etcd.log").stat().st_size > 0
        tls = c.tmp / "run" / f"node{rank}" / "etcd-tls"
        assert (tls / "peer.crt").exists() and not (tls / "ca.key").exists()
    # a stranger who knows the ports, not the token, reads and writes nothing: without the job's
    # certificate no port answers; with a node's, the password still lacks
    ports = [("127.0.0.1", c.port + 3 + 2 * i) for i in range(3)]
    with pytest.raises(EtcdUnreachable):
        Etcd(ports).get("/multinode/job/node0")
    with pytest.raises(EtcdUnreachable):
        Etcd(ports, tls=ssl.create_default_context()).put("/multinode/job/node0", "mine")
    tls = c.tmp / "run" / "node1" / "etcd-tls"
    node1 = embedded.client_context(embedded.JobTLS(*(tls / f for f in FILES)))
    with pytest.raises(EtcdRefused):
        Etcd(ports, tls=node1).put("/multinode/job/node0", "mine")
    with pytest.raises(EtcdRefused, match="authentication failed"):
        Etcd(ports, tls=node1).login(embedded.USER, embedded.password("another job's token 0"))
    killed, _, said = _node_0_killed_and_the_job_done(c)
    assert any("is node 0 from restart 1" in x for rank in (1, 2) for x in said[rank]), said
    print(f"MEASURED node 0 and its etcd member killed (the job's own etcd): job done in "
          f"{time.monotonic() - killed:.1f} s")  # fmt: skip


def _own_etcd_holds_the_seat(c: Nodes) -> None:
    end = time.monotonic() + 60
    while "node 0's seat is in the job's own etcd" not in c.log(0):
        assert time.monotonic() < end, c.log(0)[-3000:]
        time.sleep(0.2)


def test_the_jobs_own_etcd_lost_with_two_nodes_does_not_stop_node_0(started):  # noqa: F811
    """2 nodes and 2 spares, the job's etcd on members 0, 1 and 2: node 1 killed, then node 2
    (the spare in its rank). etcd's quorum is gone with them, so node 0 cannot renew its seat;
    but no node could take it either (their connections closed with no word: their processes
    and etcd members ended), so node 0 does not fence, and the last spare trains on."""
    c = started(4, FAULT_STEPS="400", ENTRYPOINT_SPARES="2", **ONE_PER_NODE)
    _checkpointed(c, 2)
    _own_etcd_holds_the_seat(c)
    _signal_tree(c, 1, signal.SIGKILL)
    end = time.monotonic() + 60
    while "restart 1: node 2 takes node rank 1" not in c.log(0):
        assert time.monotonic() < end, c.log(0)[-3000:]
        time.sleep(0.2)
    time.sleep(2)
    _signal_tree(c, 2, signal.SIGKILL)
    codes = {rank: c.procs[rank].wait(timeout=120) for rank in (0, 3)}
    assert codes == {0: 0, 3: 0}, c.log(0)[-3000:] + c.log(3)[-3000:]
    assert "the job's etcd lost 2 of its 3 members with their nodes (1, 2)" in c.log(0), c.log(0)[
        -3000:
    ]
    assert "lost node 0's seat" not in c.log(0)


def test_node_0_stopped_while_a_survivor_took_its_seat_fences_once_it_runs_again(started):  # noqa: F811
    """Node 0's whole process tree stopped (SIGSTOP: its etcd member too) long enough for a
    survivor to take its seat; when it runs again it sees the survivors' connections closed,
    each after a farewell, so it does not count them as ended nodes: it fences and exits 75.
    (The new node 0 cannot serve here: on one machine the stopped node 0 still holds the
    control port. Across node containers: tests/cluster/test_node0_takeover.py.)"""
    c = started(3, FAULT_STEPS="400", ENTRYPOINT_SPARES="1", **ONE_PER_NODE)
    _checkpointed(c, 2)
    _own_etcd_holds_the_seat(c)
    _signal_tree(c, 0, signal.SIGSTOP)
    try:
        _taken_over(c)
    finally:
        _signal_tree(c, 0, signal.SIGCONT)
    assert c.procs[0].wait(timeout=60) == 75, c.log(0)[-3000:]
    assert "this node lost node 0's seat in etcd" in c.log(0), c.log(0)[-3000:]
    assert "the job's etcd lost" not in c.log(0)
    c.kill_everything()


def _said_at(c: Nodes, rank: int, text: str) -> float:
    """When (time.time()) node `rank` first logged a line with `text`."""
    for line in c.log(rank).splitlines():
        if line.startswith("{") and text in (event := json.loads(line))["event"]:
            return datetime.fromisoformat(event["timestamp"]).timestamp()
    raise AssertionError(f"node {rank} never said {text!r}: {c.log(rank)[-3000:]}")


def _node_0_killed_and_the_job_done(c: Nodes) -> tuple[float, float, dict[int, list[str]]]:
    """Node 0's tree killed; nodes 1 and 2 finish the job, resumed from the checkpoint: when
    node 0 was killed (time.monotonic() and time.time()), and what each survivor said."""
    killed_at = time.time()
    _signal_tree(c, 0, signal.SIGKILL)
    killed = time.monotonic()
    codes = {rank: c.procs[rank].wait(timeout=120) for rank in (1, 2)}
    assert codes == {1: 0, 2: 0}, c.log(1)[-3000:] + c.log(2)[-3000:]
    _finished(c, 2, 1)
    return killed, killed_at, {rank: _events(c.log(rank)) for rank in (1, 2)}


def _url(endpoint: tuple[str, int]) -> str:
    return f"http://{endpoint[0]}:{endpoint[1]}"


def _unstarted(tmp_path, etcd, job: str) -> Nodes:
    """3 nodes with a spare on the module's etcd, each started by the test (one through a
    relay)."""
    return Nodes(
        tmp_path,
        n=3,
        FAULT_STEPS=STEPS,
        ENTRYPOINT_ETCD=_url(etcd.endpoint),
        ENTRYPOINT_JOB_ID=job,
        ENTRYPOINT_SPARES="1",
        **ONE_PER_NODE,
    )


def test_node_0_cut_off_from_etcd_fences_itself_and_a_survivor_goes_on(tmp_path, etcd):
    """Node 0 reaches etcd through a relay that is cut (silence, as a network cut is): it cannot
    renew its lease, so it kills its trainers and exits 75 before etcd can free its seat; the
    survivors see it gone, one takes the seat once the lease ends, and the job finishes."""
    relay = Relay(etcd.endpoint)
    c = _unstarted(tmp_path, etcd, "takeover-fence")
    c.start(0, ENTRYPOINT_ETCD=_url(relay.endpoint))
    c.start(1), c.start(2)
    try:
        _checkpointed(c, 2)
        relay.cut()
        cut = time.monotonic()
        assert c.procs[0].wait(timeout=30) == 75, c.log(0)[-3000:]
        fenced = time.monotonic() - cut
        assert fenced < TTL, fenced  # within the lease, before etcd frees the seat
        assert "this node lost node 0's seat in etcd (no renewal" in c.log(0), c.log(0)[-3000:]
        codes = {rank: c.procs[rank].wait(timeout=120) for rank in (1, 2)}
        assert codes == {1: 0, 2: 0}, c.log(1)[-3000:] + c.log(2)[-3000:]
        _finished(c, 2, 1)
        print(f"MEASURED node 0 cut off from etcd: fenced and out {fenced:.1f} s after the cut")
    finally:
        c.kill_everything()


def test_node_0_started_again_joins_the_new_node_0_and_stands_by(cluster):
    """After the takeover, node 0's platform starts it again (a pod restarted): it finds its seat
    held in etcd, joins that node 0 instead of serving a job of its own, and stands by. Then the
    third node is killed and started again: it too reads the holder in etcd and joins it (not
    the lost node 0's address). Every node exits 0."""
    c = cluster(3, "takeover-back", ENTRYPOINT_SPARES="1", FAULT_STEPS="900")
    _checkpointed(c, 2)
    _signal_tree(c, 0, signal.SIGKILL)
    c.procs[0].wait()
    _taken_over(c)
    c.start(0)
    joined = "holds node 0's seat in etcd: this node, started again, joins it"
    end = time.monotonic() + 60
    while not any("standing by" in x for x in _events(c.log(0))):
        assert time.monotonic() < end and c.procs[0].poll() is None, c.log(0)[-3000:]
        time.sleep(0.2)
    assert any(joined in x for x in _events(c.log(0))), c.log(0)[-3000:]
    (line,) = {x for r in (1, 2) for x in _events(c.log(r)) if "is node 0 from restart 1" in x}
    other = 3 - int(line.split("lost; node ")[1].split()[0])  # neither node 0 nor the holder
    _signal_tree(c, other, signal.SIGKILL)
    c.procs[other].wait()
    time.sleep(2)  # the holder restarts the job without it
    c.start(other)  # its log anew
    assert c.wait(180) == {0: 0, 1: 0, 2: 0}, c.log(other)[-3000:]
    assert any(joined in x for x in _events(c.log(other))), c.log(other)[-3000:]


def test_a_node_0_started_again_joins_the_node_that_knocks_with_the_jobs_token(nodes):  # noqa: F811
    """The knock (supervise/knock.py) at a real node 0 that its platform started again, still at
    its first join: a knock with another job's token is refused and changes nothing; the job's
    own makes it stop serving and join the knocker's node 0 (on loopback that is its own host
    and port, which nobody serves then: it waits, and its join times out). Whole, with the job's
    own etcd and a standby at the end: tests/cluster/test_node0_takeover.py (one host cannot
    hold the new node 0's port and node 0's both)."""
    c = nodes(
        n=3,
        ENTRYPOINT_SPARES="1",
        ENTRYPOINT_JOB_TOKEN=TOKEN,
        ENTRYPOINT_JOIN_TIMEOUT="15",
        **ONE_PER_NODE,
    )
    c.start(0)
    address = ("127.0.0.1", c.port + 1)
    holder = Holder(2, "127.0.0.1", f"127.0.0.1:{c.port + 1}")
    fp = Fingerprint.from_wire(FP)
    end = time.monotonic() + 30
    while "metrics of every node at" not in c.log(0):  # it serves (and has said hello)
        assert time.monotonic() < end and c.procs[0].poll() is None, c.log(0)[-3000:]
        time.sleep(0.1)
    other = Knocker(address, holder, Identity("", b"another job's token 0123456789ab"), fp)
    assert not other.knock()
    end = time.monotonic() + 10  # node 0 logs the refusal from its log writer's thread
    while "wrong job token" not in c.log(0):
        assert time.monotonic() < end, c.log(0)[-3000:]
        time.sleep(0.1)
    assert "knocked" not in c.log(0), c.log(0)[-3000:]
    assert Knocker(address, holder, Identity("", TOKEN.encode()), fp).knock()
    assert c.procs[0].wait(timeout=60) == 75, c.log(0)[-3000:]
    said = _events(c.log(0))
    joins = [i for i, x in enumerate(said) if "(it knocked at this node's control port)" in x]
    assert joins and said[joins[0]].startswith("node 2 (127.0.0.1) holds node 0's seat"), said
    assert any("knocked at this port: it holds node 0's seat" in x for x in said), said


def _taken_over(c: Nodes) -> None:
    end = time.monotonic() + 60
    while not any("is node 0 from restart 1" in x for r in (1, 2) for x in _events(c.log(r))):
        assert time.monotonic() < end, c.log(1)[-2000:] + c.log(2)[-2000:]
        time.sleep(0.2)


def test_the_whole_job_started_again_after_a_takeover_starts_anew(cluster):
    """After the takeover the whole job is lost and its platform starts every node again, with
    the same job id: node 0 finds its seat held by a member now gone, waits for that lease to
    end, and serves the job itself (it does not wait on a dead node 0 for its join timeout)."""
    c = cluster(3, "takeover-again", ENTRYPOINT_SPARES="1", FAULT_STEPS="400")
    _checkpointed(c, 2)
    _signal_tree(c, 0, signal.SIGKILL)
    _taken_over(c)
    c.kill_everything()
    for rank in range(3):
        c.start(rank, FAULT_STEPS="60")
    assert c.wait(120) == {0: 0, 1: 0, 2: 0}, c.log(0)[-3000:]
    assert "holds node 0's seat" not in c.log(0)
    assert "losing node 0 costs a restart, not the job" in c.log(0)


def test_without_a_spare_the_survivor_says_the_job_cannot_go_on(cluster):
    c = cluster(2, "takeover-none")
    c.wait_training(2)
    assert "losing node 0 (or any node) ends this job" in c.log(0), c.log(0)[-3000:]
    _signal_tree(c, 0, signal.SIGKILL)
    assert c.procs[1].wait(timeout=60) == 75
    assert "the job cannot go on without it: the job has no spare and no minimum" in c.log(1)


def test_node_0_says_at_the_start_what_losing_it_costs(tmp_path):
    c = Nodes(tmp_path, FAULT_STEPS="5", **ONE_PER_NODE)
    c.start(0), c.start(1)
    assert c.wait() == {0: 0, 1: 0}, c.log(0)[-3000:]
    said = [x for x in c.log(0).splitlines() if "losing node 0 ends this job" in x]
    assert len(said) == 1 and "ENTRYPOINT_ETCD" in said[0], said
    assert "losing node 0" not in c.log(1)


def test_etcd_set_without_a_job_id_is_refused_in_one_line(tmp_path):
    c = Nodes(tmp_path, n=1, ENTRYPOINT_ETCD="http://127.0.0.1:1", **ONE_PER_NODE)
    c.start(0)
    assert c.wait(60) == {0: 2}
    (line,) = [x for x in c.log(0).splitlines() if "ENTRYPOINT_ETCD" in x]
    assert "Set ENTRYPOINT_JOB_ID" in line and "Traceback" not in c.log(0), c.log(0)


@pytest.mark.parametrize("cut", ["silence", "hang-up"])
def test_a_cut_between_node_0_and_another_node_elects_nobody(tmp_path, etcd, cut):
    """Node 1 reaches node 0's control port through a relay that is cut (silence, as a network
    cut between the two is; or a hang-up, as a box between them that resets the connection),
    while both still reach etcd. Node 0 renews its seat all along (node 1's word in etcd that
    node 0 hung up on it frees nothing: node 2 never says so), so node 1, which takes node 0
    for lost, finds node 0 still holding it and exits 75 naming the network between them (or,
    if node 0 has finished the job meanwhile and freed the seat, reads in node 0's record that
    node 0 went on without it); node 0 takes node 1 for lost and goes on with the spare in its
    rank. No node is ever node 0 but node 0."""
    c = _unstarted(tmp_path, etcd, f"takeover-{cut}")
    c.start(0)
    relay = Relay(("127.0.0.1", c.port + 1))  # node 0's control port, as node 1 reaches it
    c.start(1, ENTRYPOINT_CONTROL_PORT=str(relay.port))
    c.start(2)
    try:
        _checkpointed(c, 2)
        relay.cut() if cut == "silence" else relay.hang_up()
        assert c.procs[1].wait(timeout=90) == 75, c.log(1)[-3000:]
        # node 1 saw node 0 hold its seat past the wait, or, once node 0 finished the job and
        # freed it, read in node 0's record that node 0 went on without it
        assert any(
            why in c.log(1)
            for why in ("a network between them", "node 0 went on without this node")
        ), c.log(1)[-3000:]
        codes = {rank: c.procs[rank].wait(timeout=120) for rank in (0, 2)}
        assert codes == {0: 0, 2: 0}, c.log(0)[-3000:] + c.log(2)[-3000:]
        assert "lost node 1" in c.log(0), c.log(0)[-3000:]
        assert not any("is node 0 from" in c.log(rank) for rank in range(3))
        assert "lost node 0's seat" not in c.log(0), c.log(0)[-3000:]  # never fenced
    finally:
        c.kill_everything()
