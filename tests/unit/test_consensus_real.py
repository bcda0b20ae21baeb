"""Node 0's seat and the job's state on a real etcd (tests/unit/etcd_server.py), held by real
processes (tests/seat_holder.py, no torch) that the tests kill or cut off from etcd."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from entrypoint.consensus.election import (
    Holder,
    campaign,
    depose,
    forget_hangups,
    hang_up,
    holder,
    hung_up_on,
    publish,
    read_state,
    wait_vacant,
)
from entrypoint.consensus.etcd import Etcd, EtcdRefused, EtcdUnreachable
from entrypoint.consensus.lease import RENEWALS, LeaseKeeper
from entrypoint.control.identity import Identity
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.settings import Settings
from entrypoint.plan.values import endpoints_from
from entrypoint.supervise.takeover import connect
from tests.unit import etcd_server
from tests.unit.etcd_server import EtcdServer, Relay

ROOT = Path(__file__).resolve().parents[2]
TTL, MARGIN = 3, 1.0  # renewed every second; fenced 2 s after the last answered renewal


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


class SeatHolder:
    """tests/seat_holder.py: a process that takes node 0's seat and keeps its lease."""

    def __init__(self, endpoint: tuple[str, int], job: str, member: int, token: str = "") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests/seat_holder.py"), f"{endpoint[0]}:{endpoint[1]}",
             job, str(member), str(TTL), str(MARGIN), *([token] if token else [])],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def line(self, start: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while not (found := [x for x in self.lines if x.startswith(start)]):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if found:
            return found[0]
        raise AssertionError(f"no {start!r} line in {timeout} s: {self.lines}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def me(member: int) -> Holder:
    return Holder(member, f"host-{member}", f"127.0.0.1:{7000 + member}")


def test_one_seat_one_holder_and_only_its_term_writes_the_state(etcd, tmp_path):
    client, job = Etcd([etcd.endpoint]), tmp_path.name
    first = LeaseKeeper.grant(client, TTL, lambda why: None, MARGIN)
    second = LeaseKeeper.grant(client, TTL, lambda why: None, MARGIN)
    won = campaign(client, job, me(0), first.lease)
    assert won == Holder(0, "host-0", "127.0.0.1:7000", won.term) and won.term > 0
    assert campaign(client, job, me(1), second.lease) == won  # taken: no second node 0
    assert holder(client, job) == won
    assert publish(client, job, won, {"generation": 1, "seats": {"0": 0}})
    assert read_state(client, job) == {"generation": 1, "seats": {"0": 0}}
    first.stop(revoke=True)  # stepping down frees the seat at once
    assert holder(client, job) is None
    successor = campaign(client, job, me(1), second.lease)
    assert successor.member == 1 and successor.term > won.term
    assert not publish(client, job, won, {"generation": 99})  # the old term writes nothing
    assert publish(client, job, successor, {"generation": 2})
    assert read_state(client, job) == {"generation": 2}
    second.stop(revoke=True)


def test_a_killed_node_0_frees_its_seat_within_its_lease_and_no_live_one_is_replaced(
    etcd, tmp_path
):
    client, job = Etcd([etcd.endpoint]), tmp_path.name
    node0 = SeatHolder(etcd.endpoint, job, 0)
    term = int(node0.line("holder 0 term", 30).split()[-1])
    mine = LeaseKeeper.grant(client, TTL, lambda why: None, MARGIN)
    try:
        # while node 0 renews, its seat is never free: two lease lengths of waiting see nothing
        assert not wait_vacant(client, job, 2 * TTL)
        assert campaign(client, job, me(1), mine.lease).member == 0
        killed = time.monotonic()
        node0.kill()
        assert wait_vacant(client, job, TTL + 2)
        won = campaign(client, job, me(1), mine.lease)
        took = time.monotonic() - killed
        assert won.member == 1 and won.term > term
        print(f"MEASURED node 0 killed: its seat taken {took:.2f} s later (lease {TTL} s)")
        assert took <= TTL + 2.5  # etcd looks for ended leases every 0.5 s; the rest is load
    finally:
        node0.kill()
        mine.stop(revoke=True)


def test_a_node_0_said_by_every_member_to_have_hung_up_is_deposed_at_once(etcd, tmp_path):
    """Node 0's seat is freed before its lease ends only by `depose`, which the survivors call
    once every member alive has said in etcd that node 0 hung up on it. A node 0 still alive
    (here: a live holder) then finds its lease ended at its next renewal and fences."""
    client, job = Etcd([etcd.endpoint]), tmp_path.name
    node0 = SeatHolder(etcd.endpoint, job, 0)
    term = int(node0.line("holder 0 term", 30).split()[-1])
    try:
        hang_up(client, job, term, 1)  # one member's word: the seat stays
        hang_up(client, job, term - 1, 2)  # an older term's hang-up is its own
        assert hung_up_on(client, job, term) == {1}
        assert hung_up_on(client, job, term - 1) == {2}
        assert not depose(client, job, term - 1)  # not the holder's term: nothing ended
        assert not wait_vacant(client, job, TTL + 1)  # renewed on
        hang_up(client, job, term, 2)
        assert hung_up_on(client, job, term) == {1, 2}
        deposed = time.monotonic()
        assert depose(client, job, term)
        assert holder(client, job) is None
        fenced = node0.line("fenced", TTL)
        assert "etcd says its lease has ended" in fenced, fenced
        assert float(fenced.split()[1]) - deposed < TTL / RENEWALS + 0.5  # its next renewal
        forget_hangups(client, job)
        assert hung_up_on(client, job, term) == frozenset() == hung_up_on(client, job, term - 1)
        assert not depose(client, job, term)  # free already
    finally:
        node0.kill()


def test_a_node_0_cut_off_from_etcd_fences_itself_before_another_can_take_its_seat(etcd, tmp_path):
    client, job = Etcd([etcd.endpoint]), tmp_path.name
    relay = Relay(etcd.endpoint)
    node0 = SeatHolder(relay.endpoint, job, 0)
    node0.line("holder 0 term", 30)
    mine = LeaseKeeper.grant(client, TTL, lambda why: None, MARGIN)
    try:
        time.sleep(1.5)  # a renewal or two through the relay
        relay.cut()
        assert relay.cut_at is not None
        assert wait_vacant(client, job, TTL + 3)
        free = time.monotonic()
        assert campaign(client, job, me(1), mine.lease).member == 1
        fenced = float(node0.line("fenced", 5).split()[1])
        print(f"MEASURED node 0 cut off: fenced {fenced - relay.cut_at:.2f} s after the cut, "
              f"{free - fenced:.2f} s before its seat was free")  # fmt: skip
        assert fenced < free  # the old node 0 stopped its trainers before the seat was free
        assert fenced - relay.cut_at <= TTL - MARGIN + 1.0  # the keeper thread woke late under load
        assert "no renewal of its etcd lease answered" in node0.line("fenced", 0)
    finally:
        node0.kill()
        mine.stop(revoke=True)


def test_a_lease_etcd_ended_fences_at_the_next_renewal(etcd):
    client = Etcd([etcd.endpoint])
    fenced: list[str] = []
    keeper = LeaseKeeper.grant(client, TTL, fenced.append, MARGIN)
    client.revoke(keeper.lease)  # as etcd does when the lease ran out while this node slept
    deadline = time.monotonic() + TTL
    while not fenced and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fenced == ["etcd says its lease has ended"]
    keeper.stop()


def test_no_endpoint_answering_is_one_error_naming_them():
    client = Etcd([("nothing.invalid", 2379)], timeout=0.5)
    with pytest.raises(
        EtcdUnreachable, match=r"no etcd endpoint answered /v3/kv/range \(nothing.invalid:2379\)"
    ):
        client.get("k")


@pytest.mark.parametrize(
    ("text", "endpoints"),
    [
        ("http://a:2379,http://b:2380", (("a", 2379), ("b", 2380))),  # etcdctl's --endpoints
        ("a:1, b", (("a", 1), ("b", 2379))),
        ("http://[fd00::1]:2379", (("fd00::1", 2379),)),
        ("https://a:2379,https://b:2379", (("a", 2379), ("b", 2379))),
    ],
)
def test_endpoints_as_etcdctl_writes_them(text, endpoints):
    assert endpoints_from(text) == endpoints


@pytest.mark.parametrize(
    "text", ["", "unix://a:2379", "a:port", "http://a:1/x", "http://a:1,https://b:1"]
)
def test_endpoints_that_are_not_refused(text):
    with pytest.raises(ValueError):
        endpoints_from(text)


# -- an etcd as a platform gives it: https, a client certificate asked for, etcd's auth on ---------


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    server, env = etcd_server.secured(tmp_path_factory.mktemp("etcd-tls"))
    yield env
    server.stop()


def _settings(env: dict[str, str], **changed: str) -> Settings:
    return Settings.from_env({k: v for k, v in (env | changed).items() if v})


IDENTITY = Identity(job="tls-job")


def test_an_etcd_with_tls_and_auth_holds_the_seat_as_its_settings_say(secured):
    """ENTRYPOINT_ETCD=https://..., its CA, a client certificate and a user: node 0's seat is
    taken and the job's state written through it, as without TLS."""
    found = connect(_settings(secured), IDENTITY)
    assert found is not None
    etcd, job = found
    keeper = LeaseKeeper.grant(etcd, TTL, lambda why: None, MARGIN)
    try:
        seat = campaign(etcd, job, me(0), keeper.lease)
        assert holder(etcd, job) == seat
        assert publish(etcd, job, seat, {"generation": 1})
        assert read_state(etcd, job) == {"generation": 1}
    finally:
        keeper.stop(revoke=True)


def test_without_its_certificate_or_password_etcd_answers_nothing_of_the_job(secured):
    no_certificate = {"ENTRYPOINT_ETCD_CERT": "", "ENTRYPOINT_ETCD_KEY": ""}
    for unset in (no_certificate, {"ENTRYPOINT_ETCD_CACERT": ""}):  # or etcd's not trusted
        found = connect(_settings(secured, **unset), IDENTITY)
        assert found is not None
        with pytest.raises(EtcdUnreachable):
            found[0].get("/multinode/tls-job/node0")
    wrong = connect(_settings(secured, ENTRYPOINT_ETCD_PASSWORD="not it"), IDENTITY)
    assert wrong is not None
    with pytest.raises(EtcdRefused, match="authentication failed"):
        wrong[0].get("/multinode/tls-job/node0")


@pytest.mark.parametrize(
    ("changed", "variable"),
    [
        ({"ENTRYPOINT_ETCD_CACERT": "/nonexistent/ca.pem"}, "ENTRYPOINT_ETCD_CACERT"),
        ({"ENTRYPOINT_ETCD_CERT": "/nonexistent/c.pem"}, "ENTRYPOINT_ETCD_CERT"),
        ({"ENTRYPOINT_ETCD_CERT": ""}, "ENTRYPOINT_ETCD_KEY"),  # a key without its certificate
        ({"ENTRYPOINT_ETCD_PASSWORD": ""}, "ENTRYPOINT_ETCD_USER"),
        ({"ENTRYPOINT_ETCD_USER": ""}, "ENTRYPOINT_ETCD_PASSWORD"),
        ({"ENTRYPOINT_ETCD": "http://127.0.0.1:2379"}, "ENTRYPOINT_ETCD"),  # TLS files, no https
        ({"ENTRYPOINT_ETCD": ""}, "ENTRYPOINT_ETCD_CACERT"),  # for no etcd at all
    ],
)
def test_etcd_access_settings_that_cannot_work_are_one_line(secured, changed, variable):
    with pytest.raises(ConfigError) as caught:
        connect(_settings(secured, **changed), IDENTITY)
    assert caught.value.variable == variable
    assert "\n" not in str(caught.value) and "not it" not in str(caught.value)
