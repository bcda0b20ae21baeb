"""Node 0's decisions as a table of events: no sockets, no clocks
(entrypoint.coordinator.conductor)."""

import pytest
from fingerprints import fingerprint

from entrypoint.control.actions import ALL, Log, Send
from entrypoint.control.messages import (
    Beat,
    Done,
    Elsewhere,
    Exit,
    Go,
    Hello,
    Restart,
    Signal,
    Stop,
)
from entrypoint.control.node_stats import NodeStats
from entrypoint.control.rank_records import Failure
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.state import Limits
from entrypoint.plan.errors import EXIT_CONFIG, EXIT_PEERS

FP = {
    "image_lock": "abc",
    "image_revision": "r1",
    "python": "3.13.5",
    "torch": "2.10.0",
    "jax": "0.12.0.1",
    "deepspeed": "0.19.8",
    "nccl": "2.27.5",
    "cuda_driver": "12",
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "gpus_per_node": 8,
    "packages": {"torch": "2.10.0", "tqdm": "4.70.1"},
    "data": None,
}
LIMITS = Limits(
    join_timeout=60, heartbeat_timeout=30, max_restarts=0, max_clock_skew=30, monitor_interval=0
)


def hello(member, fp=FP, host=None, time=1000.0):
    return Hello(
        member=member, host=host or f"worker-{member}", time=time, fingerprint=fingerprint(fp)
    )


def stops(actions):
    return [a.message for a in actions if isinstance(a, Send) and isinstance(a.message, Stop)]


def joined(n=2, limits=LIMITS):
    c = Conductor(n, limits, now=0.0)
    for m in range(n):
        actions = c.hello(m, hello(m), now=1.0, wall_now=1000.0)
    assert actions[-1] == Send(ALL, Go(0, ()))
    return c


def test_go_when_every_node_joined_and_matches():
    c = Conductor(2, LIMITS, now=0.0)
    assert c.hello(1, hello(1), now=5.0, wall_now=1000.0) == []  # node 1 first: order is free
    actions = c.hello(0, hello(0), now=7.0, wall_now=1000.0)
    assert any(isinstance(a, Log) and "joined in 7.0 s and match" in a.text for a in actions)
    assert c.job.phase == "run"


def test_mismatch_stops_every_node_naming_the_odd_one_and_the_field():
    c = Conductor(3, LIMITS, now=0.0)
    odd = FP | {"deepspeed": "0.19.7", "packages": {"torch": "2.10.0", "tqdm": "4.66.0"}}
    c.hello(0, hello(0), now=1, wall_now=1000)
    c.hello(1, hello(1, odd), now=1, wall_now=1000)
    (stop,) = stops(c.hello(2, hello(2), now=1, wall_now=1000))
    assert stop.code == EXIT_CONFIG
    assert (
        "node 1 (worker-1) differs: deepspeed 0.19.7 vs 0.19.8 on node 0 (worker-0)" in stop.reason
    )
    assert "tqdm 4.66.0 vs 4.70.1" in stop.reason
    assert "node 0 (worker-0) differs" not in stop.reason and "node 2" not in stop.reason


def test_two_nodes_differing_name_the_one_that_is_not_node_0():
    c = Conductor(2, LIMITS, now=0.0)
    c.hello(0, hello(0), now=1, wall_now=1000)
    (stop,) = stops(c.hello(1, hello(1, FP | {"gpus_per_node": 4}), now=1, wall_now=1000))
    assert "node 1 (worker-1) differs: gpus_per_node 4 vs 8" in stop.reason


def test_clock_skew_refused_above_the_bound_and_warned_above_two_seconds():
    c = Conductor(3, LIMITS, now=0.0)
    c.hello(0, hello(0, time=1000.0), now=1, wall_now=1000.0)
    c.hello(1, hello(1, time=1005.0), now=1, wall_now=1000.0)
    actions = c.hello(2, hello(2, time=1000.5), now=1, wall_now=1000.0)
    go = [a.message for a in actions if isinstance(a, Send)][0]
    assert isinstance(go, Go) and "node 1 (worker-1): clock +5.0 s" in go.warnings[0]
    c = Conductor(2, LIMITS, now=0.0)
    c.hello(0, hello(0), now=1, wall_now=1000.0)
    (stop,) = stops(c.hello(1, hello(1, time=1100.0), now=1, wall_now=1000.0))
    assert "clock +100.0 s" in stop.reason and "ENTRYPOINT_MAX_CLOCK_SKEW=30" in stop.reason


def test_data_directory_must_look_the_same_everywhere():
    c = Conductor(2, LIMITS, now=0.0)
    data = {"path": "/data", "exists": True, "files": 10, "bytes": 1000}
    c.hello(0, hello(0, FP | {"data": data}), now=1, wall_now=1000)
    (stop,) = stops(c.hello(1, hello(1, FP | {"data": data | {"files": 9}}), now=1, wall_now=1000))
    assert "data directory /data has 9 files" in stop.reason
    c = Conductor(2, LIMITS, now=0.0)
    c.hello(0, hello(0, FP | {"data": data}), now=1, wall_now=1000)
    (stop,) = stops(
        c.hello(
            1, hello(1, FP | {"data": {"path": "/data", "exists": False}}), now=1, wall_now=1000
        )
    )
    assert "node 1 (worker-1): data directory /data does not exist" in stop.reason


def test_nodes_that_never_join_stop_the_others_at_the_deadline():
    c = Conductor(4, LIMITS, now=0.0)
    c.hello(0, hello(0), now=1, wall_now=1000)
    c.hello(2, hello(2), now=1, wall_now=1000)
    assert c.tick(59.0) == []
    (stop,) = stops(c.tick(61.0))
    assert stop.code == EXIT_PEERS
    assert stop.reason.startswith("2 nodes (1, 3) did not join within 61 s")


def test_same_rank_from_two_hosts_is_a_configuration_error():
    c = Conductor(2, LIMITS, now=0.0)
    c.hello(1, hello(1, host="a"), now=1, wall_now=1000)
    (stop,) = stops(c.hello(1, hello(1, host="b"), now=2, wall_now=1000))
    assert stop.code == EXIT_CONFIG and "claimed by both a and b" in stop.reason


def test_rank_beyond_the_node_count_stops_it_and_the_job_before_training():
    """A node of this job (it passed the handshake) that plans more nodes: nothing may start."""
    c = Conductor(2, LIMITS, now=0.0)
    actions = c.hello(2, hello(2), now=1, wall_now=1000)
    sent = [(a.to, a.message.code) for a in actions if isinstance(a, Send)]
    assert sent == [(2, EXIT_CONFIG), (ALL, EXIT_CONFIG)]
    assert "node 0 plans 2 nodes" in stops(actions)[0].reason and c.job.phase == "end"


def test_a_closed_connection_while_running_loses_the_node():
    c = joined()
    (stop,) = stops(c.closed(1, now=10.0))
    assert stop.code == EXIT_PEERS
    assert stop.reason.startswith("lost node 1 (worker-1): its connection closed")


def test_a_silent_node_is_lost_after_the_heartbeat_timeout():
    c = joined()
    c.beat(0, Beat(), now=25.0)
    c.beat(1, Beat(), now=5.0)
    assert stops(c.tick(30.0)) == []
    (stop,) = stops(c.tick(36.0))
    assert stop.code == EXIT_PEERS and "lost node 1 (worker-1): silent for 31 s" in stop.reason


def test_a_node_leaving_before_go_may_come_back():
    c = Conductor(2, LIMITS, now=0.0)
    c.hello(1, hello(1), now=1, wall_now=1000)
    assert "left before the job started" in c.closed(1, now=2)[0].text
    c.hello(1, hello(1), now=3, wall_now=1000)
    assert c.hello(0, hello(0), now=4, wall_now=1000)[-1].message.kind == "go"


def test_a_failed_trainer_stops_every_node_with_its_code_and_one_summary():
    c = joined()
    failure = {
        "rank": 3,
        "local_rank": 1,
        "exitcode": 1,
        "tail": ["Traceback (most recent call last):", "ValueError: boom"],
    }
    actions = c.exited(
        1,
        Exit(
            1,
            failure=Failure.from_wire(failure),
            reason="node 1 (worker-1): rank 3 failed with exit code 1",
        ),
        now=9,
    )
    summaries = [a.text for a in actions if isinstance(a, Log) and "worker failed" in a.text]
    assert summaries == [
        "worker failed: rank 3 on node 1 (worker-1) (local rank 1), exit code 1"
        "\n    Traceback (most recent call last):\n    ValueError: boom"
    ]
    (stop,) = stops(actions)
    assert stop.code == 1


def test_a_failed_trainer_restarts_every_node_while_restarts_remain():
    c = joined(limits=Limits(join_timeout=60, heartbeat_timeout=30, max_restarts=1))
    actions = c.exited(1, Exit(1, failure=Failure(rank=1, exitcode=1)), now=9)
    restart = [a.message for a in actions if isinstance(a, Send)]
    assert restart == [Restart(1, "node 1 (worker-1)'s trainer exited with code 1")]
    assert c.job.phase == "join" and c.job.members == {}
    c.hello(0, hello(0), now=10, wall_now=1000)
    assert c.hello(1, hello(1), now=11, wall_now=1000)[-1].message == Go(1, ())
    (stop,) = stops(c.exited(0, Exit(7), now=20))  # no restart left
    assert stop.code == 7


def test_a_signal_on_one_node_stops_every_node_as_preempted():
    c = joined()
    (stop,) = stops(c.exited(1, Exit(1, signal=15), now=9))
    assert stop.code == 143 and "stopped on SIGTERM" in stop.reason


def test_done_when_every_node_exits_zero():
    c = joined()
    assert c.exited(0, Exit(0), now=9) == []
    assert c.exited(1, Exit(0), now=10)[-1] == Send(ALL, Done())


def test_a_node_restarted_by_its_platform_while_running_stops_the_job():
    c = joined()
    (stop,) = stops(c.hello(1, hello(1), now=20, wall_now=1000))
    assert stop.code == EXIT_PEERS and "started again while the job was running" in stop.reason


def test_monitor_table_every_interval():
    c = joined(limits=Limits(monitor_interval=60))
    c.beat(
        0,
        Beat(
            NodeStats.from_wire(
                {"gpus": [{"util": 90, "mem_used_mib": 40960, "mem_total_mib": 81920}] * 8}
            )
        ),
        now=50,
    )
    c.beat(1, Beat(NodeStats(load=1.5)), now=55)
    (table,) = [a.text for a in c.tick(61.0) if isinstance(a, Log)]
    assert "8 GPU, util 90%, mem 320.0/640 GiB" in table and "CPU, load 1.5" in table


@pytest.mark.parametrize("n", [2, 8, 32])
def test_join_is_linear_in_node_count(n):
    c = Conductor(n, LIMITS, now=0.0)
    for m in range(n - 1):
        assert c.hello(m, hello(m), now=1, wall_now=1000) == []
    assert c.hello(n - 1, hello(n - 1), now=1, wall_now=1000)[-1].message.kind == "go"


# -- which failure is the cause, and signals passed on (tests/cluster/test_faults.py shows both
# in real containers) --------------------------------------------------------------------------

WINDOW = Limits(join_timeout=60, heartbeat_timeout=30, monitor_interval=0, failure_window=3)
CRASH = {
    "rank": 3,
    "local_rank": 1,
    "exitcode": 1,
    "time": 1002.0,
    "tail": ["RuntimeError: injected failure at step 25 on rank 3"],
}
BROKEN_PEER = {
    "rank": 0,
    "local_rank": 0,
    "exitcode": 1,
    "time": 1004.0,
    "tail": ["RuntimeError: [gloo/transport/tcp/pair.cc:547] Connection closed by peer"],
}


def summaries(actions):
    return [a.text for a in actions if isinstance(a, Log) and a.text.startswith("worker failed")]


def test_the_crash_is_named_not_the_peer_it_broke_that_reported_first():
    """Rank 3 crashes; rank 0's collective breaks 2 s later, but node 0's report arrives first:
    node 0 waits for every node's report and names the rank that failed first."""
    c = joined(limits=WINDOW)
    assert c.exited(0, Exit(1, failure=Failure.from_wire(BROKEN_PEER)), now=10) == []
    actions = c.exited(
        1, Exit(1, failure=Failure.from_wire(CRASH)), now=11
    )  # every node reported: judged
    (summary,) = summaries(actions)
    assert summary.startswith("worker failed: rank 3 on node 1 (worker-1) (local rank 1)")
    assert "injected failure" in summary and "Connection closed" not in summary
    assert stops(actions)[0].code == 1


def test_the_crash_is_named_when_its_broken_peer_seems_earlier_on_node_0s_clock():
    """Under load the clocks' offset (estimated one way, from each node's hello) can put the
    broken peer's time before the crash's: a rank that only lost a peer comes after one that
    did not, whatever the times say."""
    c = joined(limits=WINDOW)
    early_peer = BROKEN_PEER | {"time": 1001.0, "peer_lost": True}
    c.exited(0, Exit(1, failure=Failure.from_wire(early_peer)), now=10)
    actions = c.exited(1, Exit(1, failure=Failure.from_wire(CRASH | {"peer_lost": False})), now=11)
    assert summaries(actions)[0].startswith("worker failed: rank 3 on node 1 (worker-1)")


def test_a_lone_failure_is_judged_when_the_window_ends():
    c = joined(limits=WINDOW)
    assert c.exited(1, Exit(1, failure=Failure.from_wire(CRASH)), now=10) == []
    assert stops(c.tick(12.5)) == []
    actions = c.tick(13.5)  # node 0's trainer still runs (or hangs): 3 s, no more
    assert stops(actions)[0].code == 1 and "rank 3 on node 1" in summaries(actions)[0]
    assert c.exited(0, Exit(1, failure=Failure.from_wire(BROKEN_PEER)), now=14) == []  # judged once


def test_failure_times_are_compared_on_node_0s_clock():
    """Node 1's clock runs 3 s ahead: its 1004.0 is node 0's 1001.0, before node 0's 1002.0."""
    c = Conductor(2, WINDOW, now=0.0)
    c.hello(0, hello(0, time=1000.0), now=1, wall_now=1000.0)
    c.hello(1, hello(1, time=1003.0), now=1, wall_now=1000.0)
    c.exited(0, Exit(1, failure=Failure.from_wire(CRASH | {"rank": 0, "time": 1002.0})), now=10)
    actions = c.exited(
        1, Exit(1, failure=Failure.from_wire(CRASH | {"rank": 2, "time": 1004.0})), now=10
    )
    assert summaries(actions)[0].startswith("worker failed: rank 2 on node 1")


def test_a_lost_node_during_the_window_ends_the_job_at_once():
    c = joined(limits=WINDOW)
    c.exited(0, Exit(1, failure=Failure.from_wire(BROKEN_PEER)), now=10)
    (stop,) = stops(c.closed(1, now=10.5))
    assert stop.code == EXIT_PEERS and c.tick(20) == []


def test_a_stopping_signal_goes_to_every_node_and_the_end_names_who_received_it():
    """One pod preempted (Kubernetes sends SIGTERM to that pod only): its peers must checkpoint
    with it, so node 0 passes the signal on to every node at once."""
    c = joined()
    actions = c.signalled(1, Signal(15), now=5)
    assert Send(ALL, Signal(15, "node 1 (worker-1) received SIGTERM")) in actions
    assert c.signalled(0, Signal(15), now=5.1) == []  # passed on once
    (stop,) = stops(c.exited(0, Exit(143, signal=15), now=9))  # node 0's workers first
    assert stop.code == 143
    assert stop.reason.startswith("stopped on SIGTERM, which node 1 (worker-1) received")


def test_usr1_is_noted_but_not_passed_on():
    """SLURM's --signal=USR1@T reaches every node's task itself; passing it on would double it."""
    c = joined()
    actions = c.signalled(0, Signal(10), now=5)
    assert [a for a in actions if isinstance(a, Send)] == []
    assert "node 0 (worker-0) received SIGUSR1" in actions[0].text


def test_a_node_0_started_again_before_its_job_formed_joins_the_node_that_knocks():
    """A node of this job that holds node 0's seat knocks at node 0's port (supervise/knock.py;
    the server closes the knock): a node 0 still at its first join is told to join it (its own
    connection, member 0); a job that formed here says so once; its own knock, nothing."""
    knock = Hello(2, "worker-2", 1000.0, fingerprint(FP), holds="2 worker-2 worker-2:29501")
    c = Conductor(3, LIMITS, now=0.0)
    c.hello(0, hello(0), now=1.0, wall_now=1000.0)
    actions = c.hello(2, knock, now=2.0, wall_now=1000.0)
    assert actions[1:] == [Send(0, Elsewhere("2 worker-2 worker-2:29501"))]
    assert 2 not in c.job.members  # a knock is no join
    formed = joined(2)
    said = formed.hello(1, knock, now=2.0, wall_now=1000.0)
    assert [type(a) for a in said] == [Log]
    assert "says it holds node 0's seat; this job runs here" in said[0].text
    assert formed.hello(1, knock, now=3.0, wall_now=1000.0) == []
    own = Hello(0, "worker-0", 1000.0, fingerprint(FP), holds="0 worker-0 worker-0:29501")
    assert joined(2).hello(0, own, now=2.0, wall_now=1000.0) == []
