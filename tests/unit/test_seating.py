"""Spares, shrinking and growing back as tables of events (entrypoint.coordinator.roster and
.seating): who sits in which node rank after each loss, what node 0 says, and when the job ends
instead."""

from dataclasses import replace

import pytest
from fingerprints import fingerprint

from entrypoint.control.actions import ALL, Close, Log, Send
from entrypoint.control.messages import Beat, Done, Exit, Go, Hello, Restart, Signal, Stop
from entrypoint.control.rank_records import Failure
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.roster import Roster, changes, seat
from entrypoint.coordinator.state import Limits
from entrypoint.plan.errors import EXIT_CONFIG, EXIT_PEERS

FP = {"image_lock": "abc", "torch": "2.10.0", "gpus_per_node": 8, "packages": {}, "data": None}
LIMITS = Limits(
    join_timeout=60, heartbeat_timeout=30, max_restarts=0, max_clock_skew=30, monitor_interval=0
)


def hello(member, fp=FP, host=None):
    return Hello(
        member=member, host=host or f"worker-{member}", time=1000.0, fingerprint=fingerprint(fp)
    )


def sent(actions, kind):
    return {a.to: a.message for a in actions if isinstance(a, Send) and isinstance(a.message, kind)}


def logs(actions):
    return " | ".join(a.text for a in actions if isinstance(a, Log))


def started(members, full, least, limits=LIMITS, now=1.0):
    c = Conductor(members, limits, 0.0, roster=Roster(members, full, least))
    for m in range(members):
        actions = c.hello(m, hello(m), now=now, wall_now=1000.0)
    return c, actions


def rejoin(c, members, now):
    """Every member in `members` says hello again (after a restart); the last actions."""
    actions = []
    for m in members:
        actions = c.hello(m, hello(m), now=now, wall_now=1000.0)
    return actions


# -- the seating itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "roster, previous, alive, expected",
    [
        # a spare takes the lost node's rank; the others keep theirs
        (Roster(3, 2, 2), {0: 0, 1: 1}, [0, 2], {0: 0, 2: 1}),
        # two spares: the lowest stands in first
        (Roster(4, 2, 2), {0: 0, 1: 1}, [0, 2, 3], {0: 0, 2: 1}),
        # shrink: node 2 lost, no spare, the job runs on 2
        (Roster(3, 3, 2), {0: 0, 1: 1, 2: 2}, [0, 1], {0: 0, 1: 1}),
        # shrink: node 1 lost, node 2 moves down so that the ranks stay contiguous
        (Roster(3, 3, 2), {0: 0, 1: 1, 2: 2}, [0, 2], {0: 0, 2: 1}),
        # grow back: a replaced node (standing by) takes the free rank at the next start
        (Roster(3, 3, 2), {0: 0, 2: 1}, [0, 1, 2], {0: 0, 2: 1, 1: 2}),
        # nothing lost: nobody moves, the spare keeps standing by
        (Roster(3, 2, 2), {0: 0, 1: 1}, [0, 1, 2], {0: 0, 1: 1}),
        # node 0 gone: no seating (the job ends)
        (Roster(3, 2, 2), {0: 0, 1: 1}, [1, 2], {}),
    ],
)
def test_seat(roster, previous, alive, expected):
    assert seat(roster, previous, alive) == expected


@pytest.mark.parametrize(
    "roster, previous, alive, head, expected",
    [
        # node 0 lost, node 1 holds node 0's seat in etcd now: it takes node rank 0 (it serves
        # the rendezvous), and the spare the rank it left
        (Roster(3, 2, 2), {0: 0, 1: 1}, [1, 2], 1, {1: 0, 2: 1}),
        # no spare, a minimum of 2: the job shrinks onto the two left, node 2 moving down
        (Roster(3, 3, 2), {0: 0, 1: 1, 2: 2}, [1, 2], 1, {1: 0, 2: 1}),
        # the last node won the seat: it takes rank 0, node 1 keeps its rank
        (Roster(3, 3, 2), {0: 0, 1: 1, 2: 2}, [1, 2], 2, {2: 0, 1: 1}),
        # a standby won it: it takes rank 0, the others keep theirs
        (Roster(3, 2, 2), {0: 0, 1: 1}, [1, 2], 2, {2: 0, 1: 1}),
        # the head lost as well: nobody is seated (the job ends)
        (Roster(3, 2, 2), {1: 0, 2: 1}, [2], 1, {}),
    ],
)
def test_seat_after_node_0_was_lost(roster, previous, alive, head, expected):
    seats = seat(roster, previous, alive, head=head)
    assert seats == expected
    assert not seats or seats[head] == 0


def test_changes_name_who_took_which_rank():
    assert changes({0: 0, 1: 1, 2: 2}, {0: 0, 2: 1, 3: 2}) == [
        "node 2 moves from node rank 2 to 1",
        "node 3 takes node rank 2",
    ]


def test_a_roster_without_spares_or_a_minimum_is_not_elastic():
    assert not Roster(4, 4, 4).elastic
    assert Roster(5, 4, 4).elastic and Roster(4, 4, 3).elastic


# -- spares ---------------------------------------------------------------------------------


def test_spares_stand_by_from_the_start_and_each_node_is_told_its_seat():
    c, actions = started(3, 2, 2)
    assert c.job.phase == "run"
    assert sent(actions, Go) == {0: Go(0, (), 0, 2), 1: Go(0, (), 1, 2), 2: Go(0, (), None, 2)}
    assert sent(actions, Go)[2].standby
    assert "training on 2 of 2 nodes; 1 standby (2)" in logs(actions)


def test_the_first_go_names_the_jobs_own_etcd_members_and_every_later_go_the_same():
    c = Conductor(3, LIMITS, 0.0, roster=Roster(3, 2, 2), etcd_members=3)
    for m in range(3):
        actions = c.hello(m, hello(m), now=1.0, wall_now=1000.0)
    etcd = ("0=worker-0", "1=worker-1", "2=worker-2")
    assert sent(actions, Go) == {
        0: Go(0, (), 0, 2, etcd),
        1: Go(0, (), 1, 2, etcd),
        2: Go(0, (), None, 2, etcd),
    }
    assert (
        "the job's etcd runs on 3 nodes: node 0 (worker-0), node 1 (worker-1), node 2 (worker-2)"
        in logs(actions)
    )
    c.closed(1, now=10.0)
    actions = rejoin(c, [2, 0], now=11.0)
    assert {go.etcd for go in sent(actions, Go).values()} == {etcd}  # fixed at the first go
    assert c.job.etcd == etcd


def test_the_jobs_own_etcd_takes_the_members_that_came_and_needs_three():
    c = Conductor(4, LIMITS, 0.0, roster=Roster(4, 2, 2), etcd_members=3)
    for m in (0, 1, 3):  # the spare 2 is late; the go does not wait for spares
        c.hello(m, hello(m), now=1.0, wall_now=1000.0)
    actions = c.tick(now=70.0)  # the join timeout
    assert {go.etcd for go in sent(actions, Go).values()} == {
        ("0=worker-0", "1=worker-1", "3=worker-3")
    }
    c = Conductor(3, LIMITS, 0.0, roster=Roster(3, 3, 2), etcd_members=3)
    for m in (0, 1):
        c.hello(m, hello(m), now=1.0, wall_now=1000.0)
    c.job.generation = 1  # a later start goes on with fewer (the first waits for every seat)
    actions = c.tick(now=70.0)
    assert "the job's etcd needs 3 nodes, 2 joined: losing node 0 ends this job" in logs(actions)
    assert all(go.etcd == () for go in sent(actions, Go).values())


def test_a_killed_node_gives_its_rank_to_the_spare_and_every_trainer_restarts():
    c, _ = started(3, 2, 2)
    actions = c.closed(1, now=10.0)
    assert sent(actions, Restart) == {ALL: Restart(1, sent(actions, Restart)[ALL].reason)}
    assert "lost node 1 (worker-1)" in logs(actions) and c.job.phase == "join"
    actions = rejoin(c, [2, 0], now=11.0)
    assert sent(actions, Go) == {0: Go(1, (), 0, 2), 2: Go(1, (), 1, 2)}
    assert "restart 1: node 2 takes node rank 1; training on 2 of 2 nodes; 0 standby" in logs(
        actions
    )
    assert c.job.seats == {0: 0, 2: 1} and c.job.phase == "run"


def test_a_silent_node_is_closed_and_replaced_by_the_spare():
    c, _ = started(3, 2, 2)
    c.beat(0, Beat(), now=40.0), c.beat(2, Beat(), now=40.0)
    actions = c.tick(now=40.0)
    assert sent(actions, Stop)[1].reason.startswith("node 0 dropped this node, silent for 39 s")
    assert Close(1) in actions and Restart in {
        type(a.message) for a in actions if hasattr(a, "message")
    }
    assert "silent for 39 s" in logs(actions)
    assert sent(rejoin(c, [0, 2], now=41.0), Go)[2] == Go(1, (), 1, 2)


def test_a_lost_standby_is_logged_and_training_goes_on():
    c, _ = started(4, 2, 2)
    actions = c.closed(3, now=10.0)
    assert c.job.phase == "run" and not sent(actions, Restart) and not sent(actions, Stop)
    assert "lost standby node 3 (worker-3): its connection closed; 1 standby left" in logs(actions)


def test_with_no_spare_left_a_lost_node_ends_the_job_naming_it():
    c, _ = started(3, 2, 2)
    c.closed(1, now=10.0)
    rejoin(c, [0, 2], now=11.0)
    actions = c.closed(2, now=20.0)
    (stop,) = sent(actions, Stop).values()
    assert stop.code == EXIT_PEERS
    assert "lost node 2 (worker-2)" in stop.reason
    assert "no standby left to take its place (ENTRYPOINT_SPARES=1)" in stop.reason
    assert "ENTRYPOINT_MIN_NODES" in stop.reason


def test_two_losses_in_a_row_use_two_spares():
    c, _ = started(4, 2, 2)
    c.closed(1, now=10.0)
    assert sent(rejoin(c, [0, 2, 3], now=11.0), Go)[2] == Go(1, (), 1, 2)
    c.closed(2, now=20.0)
    actions = rejoin(c, [0, 3], now=21.0)
    assert sent(actions, Go) == {0: Go(2, (), 0, 2), 3: Go(2, (), 1, 2)}


def test_a_spare_that_differs_from_node_0_is_refused_at_the_start_and_the_job_starts():
    c = Conductor(3, LIMITS, 0.0, roster=Roster(3, 2, 2))
    c.hello(0, hello(0), now=1.0, wall_now=1000.0)
    c.hello(1, hello(1), now=1.0, wall_now=1000.0)
    actions = c.hello(2, hello(2, FP | {"torch": "2.9.0"}), now=1.0, wall_now=1000.0)
    assert sent(actions, Stop)[2].code == EXIT_CONFIG and Close(2) in actions
    assert "node 2 (worker-2) does not match node 0 and cannot stand by" in logs(actions)
    assert "torch 2.9.0 vs 2.10.0" in logs(actions)
    assert sent(actions, Go) == {0: Go(0, (), 0, 2), 1: Go(0, (), 1, 2)}
    assert c.job.phase == "run"


def test_a_spare_that_never_comes_is_waited_for_until_the_join_timeout_only():
    c = Conductor(3, LIMITS, 0.0, roster=Roster(3, 2, 2))
    c.hello(0, hello(0), now=1.0, wall_now=1000.0)
    assert c.hello(1, hello(1), now=1.0, wall_now=1000.0) == []
    actions = c.tick(now=61.0)
    assert "node 2 did not join within 61 s: going on without them" in logs(actions)
    assert sent(actions, Go) == {0: Go(0, (), 0, 2), 1: Go(0, (), 1, 2)}


def test_a_missing_training_node_at_the_start_still_ends_the_job():
    c = Conductor(3, LIMITS, 0.0, roster=Roster(3, 3, 2))
    c.hello(0, hello(0), now=1.0, wall_now=1000.0)
    c.hello(1, hello(1), now=1.0, wall_now=1000.0)
    (stop,) = sent(c.tick(now=61.0), Stop).values()
    assert stop.code == EXIT_PEERS and "node 2 did not join within 61 s" in stop.reason


def test_a_standby_receiving_sigterm_does_not_stop_the_job():
    c, _ = started(3, 2, 2)
    assert not sent(c.signalled(2, Signal(15), now=5.0), Signal)
    actions = c.exited(2, Exit(143, signal=15), now=6.0)
    assert c.job.phase == "run" and not sent(actions, Stop)
    assert "lost standby node 2" in logs(actions)


def test_the_job_is_done_when_every_seated_node_finished_and_standbys_are_told():
    c, _ = started(3, 2, 2)
    assert c.exited(0, Exit(0), now=50.0) == []
    actions = c.exited(1, Exit(0), now=51.0)
    assert sent(actions, Done) == {ALL: Done()} and c.job.outcome == (0, "every node finished")


def test_a_trainer_failure_uses_restarts_not_spares_and_keeps_the_seats():
    limits = Limits(join_timeout=60, heartbeat_timeout=30, max_restarts=1, monitor_interval=0)
    c, _ = started(3, 2, 2, limits=limits)
    actions = c.exited(1, Exit(1, failure=Failure(rank=2, exitcode=1)), now=10.0)
    assert sent(actions, Restart) and "restart 1 of 1" in logs(actions)
    assert sent(rejoin(c, [0, 1, 2], now=15.0), Go) == {
        0: Go(1, (), 0, 2),
        1: Go(1, (), 1, 2),
        2: Go(1, (), None, 2),
    }


# -- shrink and grow back -------------------------------------------------------------------


def test_with_min_nodes_the_job_shrinks_onto_the_survivors_renumbered():
    c, _ = started(3, 3, 2)
    actions = c.closed(1, now=10.0)
    assert sent(actions, Restart)
    actions = rejoin(c, [0, 2], now=11.0)
    assert sent(actions, Go) == {0: Go(1, (), 0, 2), 2: Go(1, (), 1, 2)}
    assert "node 2 moves from node rank 2 to 1; training on 2 of 3 nodes" in logs(actions)


def test_below_min_nodes_the_job_ends_naming_the_lost_node():
    c, _ = started(3, 3, 2)
    c.closed(2, now=10.0)
    rejoin(c, [0, 1], now=11.0)
    (stop,) = sent(c.closed(1, now=20.0), Stop).values()
    assert stop.code == EXIT_PEERS
    assert "lost node 1 (worker-1)" in stop.reason
    assert "1 nodes left, fewer than ENTRYPOINT_MIN_NODES=2" in stop.reason


def test_a_replaced_node_stands_by_and_the_job_grows_back_at_the_next_restart():
    c, _ = started(3, 3, 2)
    c.closed(2, now=10.0)
    rejoin(c, [0, 1], now=11.0)  # training on 2 of 3
    actions = c.hello(2, hello(2, host="worker-2b"), now=30.0, wall_now=1000.0)
    assert sent(actions, Go) == {2: Go(1, (), None, 2)}
    assert "joined as a standby; 1 standby; it takes a seat at the next restart" in logs(actions)
    c.closed(1, now=40.0)  # the next loss: the standby takes it, back to... 2 of 3
    actions = rejoin(c, [0, 2], now=41.0)
    assert sent(actions, Go) == {0: Go(2, (), 0, 2), 2: Go(2, (), 1, 2)}


def test_a_replaced_node_that_differs_is_refused_and_the_job_goes_on():
    c, _ = started(3, 3, 2)
    c.closed(2, now=10.0)
    rejoin(c, [0, 1], now=11.0)
    actions = c.hello(2, hello(2, FP | {"image_lock": "zzz"}), now=30.0, wall_now=1000.0)
    assert sent(actions, Stop)[2].code == EXIT_CONFIG and c.job.phase == "run"
    assert 2 not in c.job.members


def test_a_seated_node_its_platform_restarted_keeps_its_rank():
    c, _ = started(3, 2, 2)
    actions = c.hello(1, hello(1, host="worker-1b"), now=20.0, wall_now=1000.0)
    assert sent(actions, Restart) and "started again while the job was running" in logs(actions)
    actions = rejoin(c, [0, 2], now=21.0)
    assert sent(actions, Go) == {0: Go(1, (), 0, 2), 1: Go(1, (), 1, 2), 2: Go(1, (), None, 2)}


def test_a_node_lost_during_the_restart_is_left_out():
    c, _ = started(4, 3, 2)
    c.closed(1, now=10.0)  # the spare (3) will take rank 1...
    c.hello(0, hello(0), now=11.0, wall_now=1000.0)
    c.hello(3, hello(3), now=11.0, wall_now=1000.0)
    actions = c.closed(2, now=11.5)  # ...and node 2 dies before it said hello again
    assert "lost node 2 during the restart" in logs(actions)
    assert sent(actions, Go) == {0: Go(1, (), 0, 2), 3: Go(1, (), 1, 2)}


# -- the plan: what a node trains as, and the settings refused ------------------------------

from conftest import node  # noqa: E402
from entrypoint.plan.errors import ConfigError  # noqa: E402
from entrypoint.plan.node_plan import make_plan  # noqa: E402

# A container platform's variables: WORLD_SIZE counts every node, the spares too.
PLATFORM = {"WORLD_SIZE": "3", "MASTER_ADDR": "node-0", "MASTER_PORT": "29500"}


def plan_of(rank, seat=None, **settings):
    env = PLATFORM | {"RANK": str(rank), "ENTRYPOINT_WORLD_SIZE_MEANS": "nodes"} | settings
    return make_plan(env, node(8), ["python", "train.py"], seat=seat)


def test_with_one_spare_three_nodes_train_as_two_and_the_third_stands_by():
    first, spare = plan_of(1, ENTRYPOINT_SPARES="1"), plan_of(2, ENTRYPOINT_SPARES="1")
    assert (first.nnodes, first.node_rank, first.world_size, first.standby) == (2, 1, 16, False)
    assert "--nnodes=2" in first.command and "--node-rank=1" in first.command
    assert str(first.sources["nnodes"]) == "WORLD_SIZE=3 less ENTRYPOINT_SPARES=1"
    assert first.config.endswith("/16gpu")
    assert (spare.members, spare.member, spare.standby) == (3, 2, True)
    # nodes sharing a host keep their files apart by their own index, whatever seat they take
    assert spare.files.keys() != first.files.keys()


def test_a_seat_given_by_node_0_plans_the_new_size_and_config():
    shrunk = plan_of(2, seat=(1, 2), ENTRYPOINT_MIN_NODES="2")
    assert (shrunk.nnodes, shrunk.node_rank, shrunk.world_size) == (2, 1, 16)
    assert (shrunk.members, shrunk.member, shrunk.min_nodes) == (3, 2, 2)
    assert str(shrunk.sources["node_rank"]).startswith("seated by node 0")
    assert plan_of(0, ENTRYPOINT_MIN_NODES="2").config.endswith("/16gpu")  # 24 GPUs: nearest
    assert plan_of(0, seat=(0, 1), ENTRYPOINT_MIN_NODES="1").config.endswith("/8gpu")


def test_the_fingerprint_layout_counts_nodes_as_the_platform_does():
    from entrypoint.supervise.join import layout

    trainer, spare = plan_of(1, ENTRYPOINT_SPARES="1"), plan_of(2, ENTRYPOINT_SPARES="1")
    shrunk = plan_of(1, seat=(1, 2), ENTRYPOINT_SPARES="1")
    assert layout(trainer) == replace(layout(spare), node_rank=1) == layout(shrunk)


@pytest.mark.parametrize(
    "settings, variable, words",
    [
        ({"ENTRYPOINT_SPARES": "3"}, "ENTRYPOINT_SPARES", "leaves no node to train"),
        ({"ENTRYPOINT_SPARES": "1", "ENTRYPOINT_MIN_NODES": "3"}, "ENTRYPOINT_MIN_NODES", "more"),
        ({"ENTRYPOINT_SPARES": "-1"}, "ENTRYPOINT_SPARES", ""),
        ({"ENTRYPOINT_MIN_NODES": "0"}, "ENTRYPOINT_MIN_NODES", ""),
    ],
)
def test_spare_settings_that_cannot_hold_are_refused_in_one_line(settings, variable, words):
    with pytest.raises(ConfigError) as err:
        plan_of(0, **settings)
    assert err.value.variable == variable and words in str(err.value)
    assert "\n" not in str(err.value)


def test_spares_need_one_entrypoint_per_node():
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_NNODES": "3",
        "SLURM_NTASKS": "24",
        "SLURM_NTASKS_PER_NODE": "8",
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "n[1-3]",
        "ENTRYPOINT_SPARES": "1",
    }
    with pytest.raises(ConfigError) as err:
        make_plan(env, node(8), ["python", "train.py"])
    assert err.value.variable == "ENTRYPOINT_SPARES" and "one entrypoint per node" in str(err.value)
