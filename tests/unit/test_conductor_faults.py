"""Node 0's decisions under faults (issue 16), as tables of events: a trainer's own exit code
above 128 is not a signal, a rejoining or replacement node joins the next start, a stopping
signal wins over a restart, clocks are compared once per job. No sockets, no clocks; the same
faults with real processes are in test_supervise_real.py."""

import signal

import pytest
from fingerprints import fingerprint

from entrypoint.control.actions import Log, Send
from entrypoint.control.messages import KINDS, Hello
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.state import Limits
from entrypoint.plan.errors import EXIT_CONFIG, EXIT_PEERS

FP = {"image_lock": "abc", "torch": "2.10.0", "packages": {"torch": "2.10.0"}}
LIMITS = Limits(
    join_timeout=60,
    heartbeat_timeout=30,
    max_restarts=0,
    max_clock_skew=30,
    monitor_interval=0,
    failure_window=3.0,
)
RESTARTS = Limits(
    join_timeout=60,
    heartbeat_timeout=30,
    max_restarts=1,
    max_clock_skew=30,
    monitor_interval=0,
    failure_window=3.0,
)


def hello(member, host=None, time=1000.0):
    return Hello(
        member=member, host=host or f"worker-{member}", time=time, fingerprint=fingerprint(FP)
    )


def typed(raw):
    """The Conductor takes typed messages (entrypoint.control.messages), as the server decodes
    them."""
    return KINDS[raw["t"]].from_wire(raw)


def sent(actions, kind):
    """What the actions send, in its wire form."""
    return [a.message.to_wire() for a in actions if isinstance(a, Send) and a.message.kind == kind]


def running(limits=LIMITS, n=2):
    c = Conductor(n, limits, now=0.0)
    for m in range(n):
        c.hello(m, hello(m), now=1.0, wall_now=1000.0)
    assert c.job.phase == "run"
    return c


def failed(code, rank=3):
    return typed(
        {
            "t": "exit",
            "code": code,
            "failure": {"rank": rank, "local_rank": 1, "exitcode": code, "tail": ["boom"]},
        }
    )


@pytest.mark.parametrize("code", [134, 139, 137, 255, 130, 143])
def test_a_trainer_code_above_128_is_a_failure_when_no_node_received_a_signal(code):
    c = running()
    c.exited(1, failed(code), now=5.0)
    (stop,) = sent(
        c.exited(0, typed({"t": "exit", "code": 1, "failure": {"tail": []}}), now=5.5)
        or c.tick(9.0),
        "stop",
    )
    assert stop["code"] == code and "signal" not in stop  # the peers get SIGTERM
    assert f"exited with code {code}" in stop["reason"]


def test_the_same_code_after_a_node_received_that_signal_is_a_stop_on_it():
    c = running()
    c.signalled(1, typed({"t": "signal", "signal": int(signal.SIGTERM)}), now=4.0)
    (stop,) = sent(c.exited(0, failed(143, rank=0), now=5.0), "stop")  # the shared stop flag
    assert stop["code"] == 143 and stop["signal"] == signal.SIGTERM
    assert "which node 1 (worker-1) received" in stop["reason"]


def test_a_trainer_that_exits_130_itself_is_restarted_like_any_failure():
    c = running(RESTARTS)
    c.exited(1, failed(130), now=5.0)
    actions = c.tick(8.5)
    assert sent(actions, "restart") and not sent(actions, "stop")


def test_a_stopping_signal_in_the_failure_window_ends_the_job_instead_of_restarting():
    c = running(RESTARTS)
    assert c.exited(1, failed(3), now=5.0) == []  # waiting for the other reports
    actions = c.signalled(0, typed({"t": "signal", "signal": int(signal.SIGTERM)}), now=6.0)
    (stop,) = sent(actions, "stop")
    assert stop["code"] == 143 and stop["signal"] == signal.SIGTERM
    assert "no restart: node 0 (worker-0) received SIGTERM" in stop["reason"]
    assert not sent(actions, "restart") and c.job.phase == "end"
    assert any(isinstance(a, Log) and a.text.startswith("worker failed: rank 3") for a in actions)


def test_a_failure_after_a_stopping_signal_does_not_restart_either():
    c = running(RESTARTS)
    c.signalled(0, typed({"t": "signal", "signal": int(signal.SIGTERM)}), now=4.0)
    c.exited(1, failed(1), now=5.0)
    (stop,) = sent(c.tick(8.5), "stop")
    assert stop["code"] == 143


def test_a_signal_said_during_a_restart_ends_the_job():
    """A node that received SIGTERM as node 0 decided to restart: it says so instead of
    joining again (its hello not counted yet)."""
    c = running(RESTARTS)
    c.exited(1, failed(1), now=5.0)
    assert sent(c.tick(8.5), "restart") and c.job.phase == "join"
    (stop,) = sent(c.exited(1, typed({"t": "exit", "code": 143, "signal": 15}), now=9.0), "stop")
    assert stop["code"] == 143 and stop["signal"] == 15


def test_a_node_started_again_during_training_is_the_first_member_of_the_restart():
    """Its old connection is still open (a paused node); it says hello: the job restarts and
    the newcomer is counted, so node 0's own hello completes the join (before: both waited for
    node 1 until the join timeout, and exited 75)."""
    c = running(RESTARTS)
    actions = c.hello(1, hello(1), now=10.0, wall_now=1000.0)
    assert sent(actions, "restart") and 1 in c.job.members and c.job.phase == "join"
    (go,) = sent(c.hello(0, hello(0), now=12.0, wall_now=1000.0), "go")
    assert go["generation"] == 1 and c.job.phase == "run"


def test_a_replacement_with_a_new_host_name_is_not_claimed_by_both():
    c = running(RESTARTS)
    actions = c.hello(1, hello(1, host="worker-1-replacement"), now=10.0, wall_now=1000.0)
    assert not sent(actions, "stop") and sent(actions, "restart")
    c.hello(0, hello(0), now=12.0, wall_now=1000.0)
    assert c.job.members[1].host == "worker-1-replacement" and c.job.phase == "run"


def test_two_hosts_with_one_rank_at_the_first_start_are_still_refused():
    c = Conductor(3, LIMITS, now=0.0)
    c.hello(1, hello(1, host="a"), now=1.0, wall_now=1000.0)
    (stop,) = sent(c.hello(1, hello(1, host="b"), now=1.0, wall_now=1000.0), "stop")
    assert stop["code"] == EXIT_CONFIG and "claimed by both a and b" in stop["reason"]


def test_a_hello_in_the_failure_window_restarts_once_and_forgets_the_pending_failure():
    c = running(RESTARTS)
    c.exited(0, failed(1, rank=0), now=5.0)
    assert sent(c.hello(1, hello(1), now=6.0, wall_now=1000.0), "restart")
    c.hello(0, hello(0), now=7.0, wall_now=1000.0)
    assert c.job.phase == "run" and c.tick(12.0) == []  # no stale verdict on the old failure


def test_without_restarts_a_node_started_again_ends_the_job_with_75():
    c = running()
    (stop,) = sent(c.hello(1, hello(1), now=10.0, wall_now=1000.0), "stop")
    assert stop["code"] == EXIT_PEERS
    assert "started again while the job was running" in stop["reason"]


def test_clocks_are_compared_once_per_job_not_at_every_restart():
    c = running(RESTARTS)
    c.exited(1, failed(1), now=5.0)
    c.tick(8.5)
    c.hello(0, hello(0), now=9.0, wall_now=5000.0)
    actions = c.hello(1, hello(1, time=5000.0 + 120), now=9.0, wall_now=5000.0)  # drifted 120 s
    assert sent(actions, "go") and not sent(actions, "stop")


def test_an_old_connections_late_beats_and_close_are_not_the_new_nodes():
    """Real sockets on loopback: node 1 says hello again on a new connection while its old one
    is open (a node that hung, then was started again). The old connection's late beat is not
    counted as the new node's, and its close later loses nobody."""
    import time

    from entrypoint.control import control_channel, control_server
    from tests.unit.test_control import hello as wire_hello
    from tests.unit.test_control import typed as wire

    c = Conductor(2, RESTARTS, now=time.monotonic())
    logged = []
    server = control_server.Server(
        c, 0, heartbeat_interval=0.2, bind="127.0.0.1", log=lambda level, text: logged.append(text)
    )
    server.start()

    def connect():
        return control_channel.connect("127.0.0.1", server.port, timeout=5, log=print)

    def until(condition):
        end = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < end, logged
            time.sleep(0.02)

    node0, old = connect(), connect()
    try:
        node0.send(wire(wire_hello(0)))
        old.send(wire(wire_hello(1)))
        until(lambda: c.job.phase == "run")
        new = connect()
        new.send(wire(wire_hello(1, host="worker-1b")))
        until(lambda: c.job.generation == 1 and 1 in c.job.members)
        node0.send(wire(wire_hello(0)))
        until(lambda: c.job.phase == "run")
        seen = c.job.members[1].last_seen
        old.send(wire({"t": "beat"}))
        old.close()
        time.sleep(1.0)
        assert c.job.members[1].last_seen == seen and c.job.members[1].connected
        assert c.job.phase == "run" and not any("lost node 1" in text for text in logged)
        new.close()
        until(lambda: c.job.phase == "end")  # the new connection's close is node 1's
        assert any("lost node 1 (worker-1b)" in text for text in logged)
    finally:
        server.stop()
        for channel in (node0, old):
            channel.close()
        server.finished.wait(5)
