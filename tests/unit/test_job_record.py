"""The job's record as node 0 writes it to etcd, read back by a new node 0 that goes on with the
job: the survivors say hello again, the new head takes node rank 0 and the spare the rank it
left (entrypoint.coordinator.job_record; etcd's side: tests/unit/test_consensus_real.py)."""

import pytest
from test_seating import LIMITS, hello, logs, sent, started

from entrypoint.control.messages import Go
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.job_record import JobRecord, cannot_go_on, record_of, resumed
from entrypoint.coordinator.roster import Roster


def test_the_record_of_a_running_job_reads_back_whole():
    c, actions = started(3, 2, 2)  # 2 nodes train, 1 spare stands by
    assert sent(actions, Go)[2].standby
    record = record_of(c.job, token_digest="ab" * 32)
    assert record == JobRecord(
        head=0,
        generation=0,
        restarts_left=0,
        seats={0: 0, 1: 1},
        hosts={0: "worker-0", 1: "worker-1", 2: "worker-2"},
        token_digest="ab" * 32,
    )
    assert JobRecord.from_json(record.to_json()) == record
    assert "token" not in record.to_json().replace("token_digest", "")


def test_the_jobs_own_etcd_members_go_on_with_the_new_node_0():
    c = Conductor(3, LIMITS, 0.0, roster=Roster(3, 2, 2), etcd_members=3)
    for m in range(3):
        c.hello(m, hello(m), now=1.0, wall_now=1000.0)
    record = JobRecord.from_json(record_of(c.job).to_json())
    assert record.etcd == ("0=worker-0", "1=worker-1", "2=worker-2")
    job = resumed(record, 1, [1, 2], expected=3, limits=LIMITS, roster=Roster(3, 2, 2), now=50.0)
    assert job.gone == {0}  # the old node 0 ended, its etcd member with it (started again: none)
    successor = Conductor.resume(job)
    actions = []
    for member in (1, 2):
        actions += successor.hello(member, hello(member), now=51.0, wall_now=1000.0)
    assert {go.etcd for go in sent(actions, Go).values()} == {record.etcd}


def test_a_new_node_0_seats_the_spare_and_takes_node_rank_0():
    c, _ = started(3, 2, 2)
    record = JobRecord.from_json(record_of(c.job).to_json())  # through the store, as JSON
    job = resumed(
        record,
        1,
        [1, 2],
        expected=3,
        limits=LIMITS,
        roster=Roster(3, 2, 2),
        now=50.0,
        why="its lease in etcd ended",
    )
    successor = Conductor.resume(job)
    assert job.generation == 1 and job.lost == {0: "its lease in etcd ended"}
    actions = []
    for member in (1, 2):  # the survivors say hello to the new node 0
        actions += successor.hello(member, hello(member), now=51.0, wall_now=1000.0)
    go = sent(actions, Go)
    assert go == {1: Go(1, (), 0, 2), 2: Go(1, (), 1, 2)}
    assert "restart 1: node 1 moves from node rank 1 to 0; node 2 takes node rank 1" in logs(
        actions
    )


@pytest.mark.parametrize(
    ("roster", "alive", "why"),
    [
        (Roster(2, 2, 2), [1], "no spare and no minimum"),
        (Roster(3, 3, 3), [1, 2], "no spare and no minimum"),
        (Roster(3, 3, 2), [1], "only 1 can train, the job needs 2"),
        (Roster(3, 2, 2), [1, 2], None),  # a spare takes the rank node 1 leaves
        (Roster(3, 3, 2), [1, 2], None),  # the job shrinks onto the two left
    ],
)
def test_whether_the_job_can_go_on_without_node_0(roster, alive, why):
    c, _ = started(roster.members, roster.full, roster.min_nodes)
    said = cannot_go_on(roster, record_of(c.job), 1, alive)
    assert said == why if why is None else why in said


@pytest.mark.parametrize(
    "text",
    [
        '{"version": 2, "head": 0}',
        '{"version": 1}',
        "[]",
        "not json",
        '{"version": 1, "head": "x"}',
    ],
)
def test_anything_else_is_refused_not_guessed(text):
    with pytest.raises(ValueError):
        JobRecord.from_json(text)
