"""A master given by a name that does not resolve when the plan is made (a Kubernetes headless
Service's names appear once the pods are ready): once the node has joined node 0 through that
name, it is probed again and the plan made again before the launcher starts, so that NCCL's
socket family and interface come from its address, and the sources say when. The resolver
is the one thing replaced here: its answer changing over time is what cannot be staged on this
machine without editing /etc/hosts (tests/cluster/test_ipv6.py runs the real one, by name)."""

from dataclasses import replace

from conftest import node
from entrypoint.plan.node_plan import make_plan
from entrypoint.supervise import node as node_run
from entrypoint.supervise import probe

ENV = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "trainer-0.trainer", "MASTER_PORT": "29500"}


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, text: str, **_kw) -> None:
        self.lines.append(("info", text))

    def warning(self, text: str, **_kw) -> None:
        self.lines.append(("warning", text))


def test_the_family_is_decided_once_the_name_resolves(monkeypatch):
    monkeypatch.setattr(probe, "resolve", lambda _name: "fd00::2")
    monkeypatch.setattr(probe, "source_address", lambda _ip: None)
    facts = replace(node(8), master_ip=None)
    plan = make_plan(ENV, facts, ["python", "t.py"])
    assert "NCCL_SOCKET_FAMILY" not in plan.env  # undecided at plan time
    log = Log()
    fresh = node_run.master_resolved(plan, facts, 2.1, log)
    assert fresh is not None and fresh.master_ip == "fd00::2"
    again = make_plan(ENV, fresh, ["python", "t.py"])
    assert again.env["NCCL_SOCKET_FAMILY"] == "AF_INET6"
    source = str(again.sources["NCCL_SOCKET_FAMILY"])
    assert "the master's address is IPv6 (fd00::2), its name resolved 2.1 s after" in source
    assert any("resolved to fd00::2 2.1 s after the start" in text for _, text in log.lines)


def test_a_name_that_still_does_not_resolve_is_said(monkeypatch):
    monkeypatch.setattr(probe, "resolve", lambda _name: None)
    facts = replace(node(8), master_ip=None)
    plan = make_plan(ENV, facts, ["python", "t.py"])
    log = Log()
    assert node_run.master_resolved(plan, facts, 5.0, log) is None
    assert log.lines[-1][0] == "warning" and "still does not resolve" in log.lines[-1][1]


def test_an_address_or_a_resolved_name_is_not_probed_again(monkeypatch):
    monkeypatch.setattr(probe, "resolve", lambda _name: (_ for _ in ()).throw(AssertionError))
    log = Log()
    resolved = replace(node(8), master_ip="10.0.0.1")
    plan = make_plan(ENV, resolved, ["python", "t.py"])
    assert node_run.master_resolved(plan, resolved, 1.0, log) is None
    literal = ENV | {"MASTER_ADDR": "fd00::9"}
    unresolved = replace(node(8), master_ip=None)
    plan = make_plan(literal, unresolved, ["python", "t.py"])
    assert node_run.master_resolved(plan, unresolved, 1.0, log) is None
    assert log.lines == []
