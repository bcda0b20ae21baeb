"""The job's own etcd: 3 real etcd members started as `consensus/embedded.py` starts them (the
static bootstrap from the roster), closed to strangers by the job token, and node 0's member
and seat holder killed together, as losing node 0 does: the two left keep the quorum, and the
next member takes the seat."""

from __future__ import annotations

import http.client
import ssl
import time
from pathlib import Path

import pytest
from test_consensus_real import MARGIN, TTL, SeatHolder, me

from entrypoint.consensus import lease
from entrypoint.consensus.election import campaign, holder, publish, read_state, wait_vacant
from entrypoint.consensus.embedded import (
    Embedded,
    EtcdMember,
    JobTLS,
    base_port,
    chosen,
    client_context,
    cluster_size,
    command,
    job_tls,
    members_from,
    password,
    secure,
    sources,
    wait_ready,
)
from entrypoint.consensus.etcd import Etcd, EtcdRefused, EtcdUnreachable
from entrypoint.consensus.lease import LeaseKeeper
from tests.unit.ports import free_ports

TOKEN = "the-job-token-0123456789abcdef"


@pytest.mark.parametrize(
    ("nodes", "size"), [(1, 0), (2, 0), (3, 3), (4, 3), (5, 5), (1024, 5)]
)  # fmt: skip
def test_how_many_nodes_run_a_member(nodes, size):
    assert cluster_size(nodes) == size
    assert len(members_from([f"h{i}" for i in range(nodes)], 1)) == size


def test_each_member_is_told_the_whole_cluster_and_the_job_it_belongs_to():
    members, cluster = chosen(["0=worker-0", "1=worker-1", "3=fd00::2"], 29503)
    assert members == (0, 1, 3)
    argv = command("/usr/bin/etcd", cluster[2], cluster, "/run/etcd", "train")
    assert argv == [
        "/usr/bin/etcd",
        "--name=m2",
        "--data-dir=/run/etcd",
        "--listen-client-urls=http://[fd00::2]:29507",
        "--advertise-client-urls=http://[fd00::2]:29507",
        "--listen-peer-urls=http://[fd00::2]:29508",
        "--initial-advertise-peer-urls=http://[fd00::2]:29508",
        "--initial-cluster=m0=http://worker-0:29504,m1=http://worker-1:29506,m2=http://[fd00::2]:29508",
        "--initial-cluster-state=new",
        "--initial-cluster-token=multinode-train",
    ]  # fmt: skip
    # a member named by its host's name listens on every address (0.0.0.0 without IPv6)
    assert "--listen-client-urls=http://[::]:29503" in command(
        "etcd", cluster[0], cluster, "d", "j"
    )
    assert "--listen-peer-urls=http://0.0.0.0:29504" in command(
        "etcd", cluster[0], cluster, "d", "j", "0.0.0.0"
    )
    # a job with a token: its ports speak TLS, each admitting the job's CA's certificates alone
    _, tls_cluster = chosen(["0=worker-0", "1=worker-1", "3=fd00::2"], 29503, secure=True)
    files = JobTLS(Path("/t/ca.crt"), Path("/t/peer.crt"), Path("/t/peer.key"))
    argv = command("etcd", tls_cluster[0], tls_cluster, "d", "j", "::", files)
    assert "--listen-peer-urls=https://[::]:29504" in argv
    assert "--initial-cluster=m0=https://worker-0:29504,m1=https://worker-1:29506," in " ".join(
        argv
    )
    assert argv[-8:] == [
        "--peer-cert-file=/t/peer.crt",
        "--peer-key-file=/t/peer.key",
        "--peer-trusted-ca-file=/t/ca.crt",
        "--peer-client-cert-auth",
        "--cert-file=/t/peer.crt",
        "--key-file=/t/peer.key",
        "--trusted-ca-file=/t/ca.crt",
        "--client-cert-auth",
    ]
    assert "--listen-client-urls=https://[::]:29503" in argv
    assert "--advertise-client-urls=https://worker-0:29503" in argv


@pytest.mark.parametrize(
    ("stated", "control", "base"),
    [(None, 29501, 29503), (40000, 29501, 40000), (None, 65534, 65523)],
)  # fmt: skip
def test_the_members_ports_start_two_above_the_control_port(stated, control, base):
    assert base_port(stated, control) == base
    assert base + 9 <= 65535
    assert password(TOKEN) != TOKEN and password(TOKEN) == password(TOKEN)
    assert password(TOKEN) != password(TOKEN + "x")


@pytest.fixture
def cluster(tmp_path):
    """3 members on loopback as a job with a token starts them: their ports speak TLS."""
    port = free_ports(6)
    members = [
        EtcdMember(f"m{i}", "127.0.0.1", port + 2 * i, port + 2 * i + 1, secure=True)
        for i in range(3)
    ]
    started = [
        Embedded(
            m,
            members,
            tmp_path / m.name,
            tmp_path.name,
            tmp_path / f"{m.name}.log",
            tls=job_tls(tmp_path / f"{m.name}-tls", TOKEN, m.name, [m.host, *sources(members, m)]),
        )
        for m in members
    ]
    for each in started:
        each.start()
    yield started
    for each in started:
        each.stop()


def _ours(tmp_path: Path) -> ssl.SSLContext:
    """A node's of the job: its own certificate, signed by the CA it derives from the token."""
    return client_context(job_tls(tmp_path / "node-tls", TOKEN, "node1", ()))


def test_three_members_hold_the_job_lose_node_0s_and_a_stranger_gets_nothing(cluster, tmp_path):
    endpoints = [("127.0.0.1", m.me.client_port) for m in cluster]
    job = tmp_path.name
    ours = _ours(tmp_path)
    first = Etcd(endpoints[:1], tls=ours)
    wait_ready(first, 30)
    secure(first, TOKEN)  # member 0 of the cluster closes it, once
    secure(Etcd(endpoints[1:2], tls=ours), TOKEN)  # a second run only logs in

    # the job's certificate without the job's password (etcd's auth, the second lock)
    for stranger in (Etcd(endpoints, tls=ours), Etcd(endpoints, tls=ours)):
        with pytest.raises(EtcdRefused):
            stranger.get("/multinode/x")
        with pytest.raises(EtcdRefused):
            stranger.put("/multinode/x", "mine")
    with pytest.raises(EtcdRefused, match="authentication failed"):
        Etcd(endpoints, tls=ours).login("multinode", password("another job's token"))

    node0 = SeatHolder(endpoints[0], job, 0, TOKEN)  # node 0 talks to its own member
    term = int(node0.line("holder 0 term", 30).split()[-1])
    survivors = Etcd(endpoints[1:], tls=ours)
    survivors.login("multinode", password(TOKEN))
    assert holder(survivors, job).member == 0
    assert publish(survivors, job, holder(survivors, job), {"generation": 3})
    mine = None
    try:
        killed = time.monotonic()
        node0.kill()
        cluster[0].stop()  # node 0's etcd member goes with it
        assert wait_vacant(survivors, job, TTL + 10)
        # a fresh lease, as a member campaigns (one held through etcd's own election could have
        # been fenced by then: tests/unit/test_consensus_real.py's lease is 3 s)
        mine = LeaseKeeper.grant(survivors, TTL, lambda why: None, MARGIN)
        won = campaign(survivors, job, me(1), mine.lease)
        took = time.monotonic() - killed
        assert won.member == 1 and won.term > term
        assert read_state(survivors, job) == {"generation": 3}
        print(f"MEASURED node 0 and its etcd member killed: the seat taken {took:.2f} s later")
        assert took <= TTL + 5  # the lease, and etcd's own election among the two left
    finally:
        node0.kill()
        if mine is not None:
            mine.stop(revoke=True)


def test_node_0_keeps_its_seat_when_etcd_loses_its_leader(cluster, tmp_path):
    """Another node's member, etcd's own leader, is lost: etcd elects another leader within a
    second, and node 0 (the product's lease) renews through it without fencing."""
    endpoints = [("127.0.0.1", m.me.client_port) for m in cluster]
    ours = _ours(tmp_path)
    client = Etcd(endpoints, tls=ours)
    wait_ready(client, 30)
    secure(client, TOKEN)
    for _ in range(50):  # the leader etcd elected, by its member ID
        statuses = [Etcd([e], tls=ours).call("maintenance/status", {}) for e in endpoints]
        if statuses[0].get("leader"):
            break
        time.sleep(0.1)
    leader = next(
        i for i, s in enumerate(statuses) if s["header"]["member_id"] == statuses[0]["leader"]
    )
    node0 = 1 if leader == 0 else 0  # node 0 is on another member's node, its own member first
    mine = Etcd([endpoints[node0]] + [e for i, e in enumerate(endpoints) if i != node0], tls=ours)
    mine.login("multinode", password(TOKEN))
    fenced: list[str] = []
    keeper = LeaseKeeper.grant(mine, lease.TTL, fenced.append)
    seat = campaign(mine, tmp_path.name, me(node0), keeper.lease)
    try:
        time.sleep(lease.TTL / lease.RENEWALS - 0.1)  # just before the next renewal
        cluster[leader].stop()
        time.sleep(2 * lease.TTL)  # longer than the lease
        assert not fenced and keeper.fenced is None
        assert holder(mine, tmp_path.name) == seat
    finally:
        keeper.stop(revoke=True)


def test_the_members_ports_admit_only_the_jobs_certificates(cluster, tmp_path):
    """A job with a token: its members' ports speak TLS, and admit a certificate signed by the
    CA every node derives from the token, no other. On a member's peer port and its client port
    alike, a stranger with no certificate, or with one another job's CA signed, gets nothing,
    even one that does not check whom it speaks to; the job's own is answered. To a stranger,
    etcd is unreachable. The CA's key is never left on disk."""
    endpoints = [("127.0.0.1", m.me.client_port) for m in cluster]
    wait_ready(Etcd(endpoints, tls=_ours(tmp_path)), 30)  # the 3 members formed a cluster
    first, tls = cluster[0].me, cluster[0].tls
    assert tls is not None and "--peer-client-cert-auth" in cluster[0].argv
    assert "--client-cert-auth" in cluster[0].argv
    assert sorted(p.name for p in tls.ca.parent.iterdir() if "key" in p.name) == ["peer.key"]

    def asks(port: int, path: str, cert: JobTLS | None, checks: bool = True) -> bytes:
        context = ssl.create_default_context(cafile=str(tls.ca))
        if not checks:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        if cert is not None:
            context.load_cert_chain(str(cert.cert), str(cert.key))
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            assert response.status == 200, response.status
            return response.read()
        finally:
            conn.close()

    stranger = EtcdMember("m9", "127.0.0.1", 1, 2, secure=True)
    other = job_tls(tmp_path / "other-job", "another job's token", stranger.name, ["127.0.0.1"])
    own = job_tls(tmp_path / "own-job", TOKEN, stranger.name, ["127.0.0.1"])
    for port, path in ((first.peer_port, "/members"), (first.client_port, "/version")):
        for cert in (None, other):
            with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
                asks(port, path, cert, checks=False)
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            plain.request("GET", path)
            assert plain.getresponse().status != 200  # a TLS port's answer to plain HTTP
        except (ConnectionError, http.client.HTTPException):
            pass
        finally:
            plain.close()
        assert asks(port, path, own)
    assert first.peer_url.encode() in asks(first.peer_port, "/members", own)
    strangers = [ssl.create_default_context(), _unchecked(other)]
    for stranger_tls in (None, *strangers):
        with pytest.raises(EtcdUnreachable):
            Etcd(endpoints, tls=stranger_tls).get("/multinode/x")


def _unchecked(tls: JobTLS) -> ssl.SSLContext:
    """A client that shows `tls`'s certificate and trusts any server."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.load_cert_chain(str(tls.cert), str(tls.key))
    return context
