"""Every rank's progress: the pure rules (coordinator/rank_judgement.py), the wire, the node's
inbox and the site hook in a real torch process (trainer_side/step_hook.py,
supervise/rank_inbox.py)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ports import free_ports

from entrypoint.control import messages as m
from entrypoint.control.actions import ALL, Log, Send
from entrypoint.control.message_fields import BadMessage, check_collectives
from entrypoint.control.node_fingerprint import Fingerprint
from entrypoint.control.node_stats import NodeStats
from entrypoint.control.rank_records import Collective, Frame, RankDump, RankReport, RankStack
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.rank_judgement import (
    HANG_FLOOR,
    JobProgress,
    hang_rule,
    never_entered,
    slow_ranks,
    suspects,
    verdict,
)
from entrypoint.coordinator.state import Limits
from entrypoint.plan.errors import EXIT_HUNG
from entrypoint.supervise.rank_inbox import Inbox, Rank, main_stack
from entrypoint.trainer_side import flight, jax_cluster
from entrypoint.trainer_side.step_hook import DUMP_SIGNAL

SITE = "/venv/lib/python3.13/site-packages"


def frame(file, line, function, source=""):
    return Frame(file, line, function, source)


BACKWARD = (
    frame(f"{SITE}/torch/autograd/graph.py", 829, "_engine_run_backward"),
    frame(f"{SITE}/torch/_tensor.py", 626, "backward"),
    frame("/workspace/train.py", 40, "main", "loss.backward()"),
)
SLEEP = (frame("/workspace/train.py", 42, "main", "time.sleep(3600)"),)
RECV = (
    frame(f"{SITE}/torch/distributed/distributed_c10d.py", 2799, "recv"),
    frame("/workspace/train.py", 44, "main", "dist.recv(t, src=0)"),
)
JAX_STEP = (
    frame(f"{SITE}/jax/_src/pmap.py", 319, "wrapped"),
    frame("/workspace/train.py", 58, "main", "w, value = train_step(w, x, y)"),
)
JAX_EAGER = (
    frame(f"{SITE}/jax/_src/dispatch.py", 89, "apply_primitive"),
    frame("/workspace/train.py", 56, "main", "key, a, b = jax.random.split(key, 3)"),
)


def stack(rank, frames, member=None, steps=20):
    return RankStack(rank // 2 if member is None else member, "h", rank, steps, frames)


# -- hang rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "longest", "warmed", "collective", "seconds"),
    [
        (30.0, 0.1, True, 600, 30.0),  # ENTRYPOINT_HANG_TIMEOUT wins
        (0.0, 0.1, True, 600, 0.0),  # 0: off
        (None, 0.1, True, 600, HANG_FLOOR),  # short steps: the floor
        (None, 30.0, True, 600, 300.0),  # 10 x the longest step
        (None, 100.0, True, 600, 450.0),  # capped below the collective timeout
        (None, 0.1, False, 600, 450.0),  # before warm-up: the cap
        (None, 0.1, True, 60, 45.0),  # a short collective timeout: below it
    ],
)
def test_hang_rule(setting, longest, warmed, collective, seconds):
    assert hang_rule(setting, longest, warmed, collective).seconds == seconds


@pytest.mark.parametrize(
    ("setting", "longest", "warmed", "group", "seconds", "source"),
    [
        (None, 0.1, True, 40.0, 30.0, "0.75 x the trainer's process-group timeout (40 s)"),
        (None, 0.1, False, 40.0, 30.0, "process-group timeout (40 s) (warming up)"),
        (None, 0.1, True, 1800.0, HANG_FLOOR, "learned"),  # torch's gloo default: longer
        (None, 100.0, True, 1800.0, 450.0, "ENTRYPOINT_COLLECTIVE_TIMEOUT"),
        (20.0, 0.1, True, 10.0, 20.0, "ENTRYPOINT_HANG_TIMEOUT"),  # set: kept (and warned)
    ],
)
def test_the_trainers_own_process_group_timeout_caps_the_learned_one(
    setting, longest, warmed, group, seconds, source
):
    """A trainer that passes init_process_group(timeout=40 s): torch's timeout would fail the
    job at 40 s naming no rank; the hang is named at 30 s."""
    rule = hang_rule(setting, longest, warmed, 600, group)
    assert (rule.seconds, source in rule.source) == (seconds, True), rule


def test_the_shortest_process_group_timeout_the_ranks_report_is_the_jobs():
    p = JobProgress()
    p.beat(0, [RankReport(0, 5, 0, None, 0), RankReport(1, 5, 0, None, 0, timeout=90.0)], 1.0)
    assert p.group_timeout() == 90.0
    p.beat(1, [RankReport(2, 5, 0, None, 0, timeout=40.0)], 1.0)
    assert p.group_timeout() == 40.0
    p.beat(1, [RankReport(2, 6, 0, None, 0)], 2.0)  # a beat without it: still known
    assert p.group_timeout() == 40.0
    p.restart()
    assert p.group_timeout() is None


def test_stalled_only_when_every_rank_is_still_and_none_saves():
    p = JobProgress()
    p.beat(0, [RankReport(0, 20, 0.0, 0.01, 0.05), RankReport(1, 20, 0.0, 0.01, 0.05)], 100.0)
    assert p.stalled(105.0, 10) is None
    assert p.stalled(111.0, 10) == pytest.approx(11.0)
    p.beat(0, [RankReport(0, 20, 11.0, None, 0), RankReport(1, 20, 11.0, None, 0, True)], 111.0)
    assert p.stalled(130.0, 10) is None  # rank 1 saves a checkpoint: not a hang
    p.beat(0, [RankReport(0, 21, 0.0, None, 0), RankReport(1, 21, 0.0, None, 0)], 131.0)
    assert p.stalled(135.0, 10) is None
    assert p.stalled(500.0, 0) is None  # 0: off


def test_an_evaluation_is_progress_not_a_hang():
    """Ranks that evaluate (forward passes in eval mode, no optimizer step) for longer than the
    hang timeout are not stalled while their forward passes go on; once those stop too, they
    are."""
    p = JobProgress()
    p.beat(0, [RankReport(0, 20, 0.0, 0.01, 0.05), RankReport(1, 20, 0.0, 0.01, 0.05)], 100.0)
    # at 150 s: no step for 50 s, the last forward pass in evaluation 1 s ago on both
    p.beat(0, [RankReport(0, 20, 50.0, None, 0, False, 1.0),
               RankReport(1, 20, 50.0, None, 0, False, 1.0)], 150.0)  # fmt: skip
    assert p.stalled(155.0, 10) is None
    assert p.stalled(165.0, 10) == pytest.approx(16.0)  # the evaluation stopped too
    assert p.ranks[(0, 0)].steps == 20  # not steps: the step figures stay the training's


def test_a_rank_that_ended_is_no_longer_watched():
    p = JobProgress()
    p.beat(1, [RankReport(2, 5, 0, None, 0), RankReport(3, 5, 0, None, 0)], 10.0)
    p.beat(1, [RankReport(2, 5, 0, None, 0)], 11.0)
    assert sorted(p.ranks) == [(1, 2)]


def test_warm_up_and_the_longest_step_learned():
    p = JobProgress()
    for i in range(1, 15):
        p.beat(0, [RankReport(0, i, 0.0, 0.01, 2.0 if i == 12 else 0.1)], float(i))
    assert p.warmed and p.longest == 2.0


def test_goodput_counts_the_time_the_job_steps():
    p = JobProgress()
    for t in range(0, 21):  # a step every second for 20 s
        p.beat(0, [RankReport(0, t + 1, 0.0, None, 1.0)], float(t))
        p.tick(float(t), 1.0)
    for t in range(21, 41):  # then 20 s without one
        p.tick(float(t), 1.0)
    assert p.goodput(40.0) == pytest.approx(0.6, abs=0.1)


# -- who hangs --------------------------------------------------------------------------------


def test_the_rank_that_sleeps_is_named_not_those_that_wait():
    stacks = [stack(0, BACKWARD), stack(1, BACKWARD), stack(2, BACKWARD), stack(3, SLEEP)]
    assert [s.rank for s in suspects(stacks)] == [3]
    member, text = verdict(stacks, 31, {0: "node 0 (a)", 1: "node 1 (b)"})
    assert member == 1
    assert text.startswith("rank 3 on node 1 (b) has not stepped for 31 s: in train.py:42")
    assert "time.sleep(3600)" in text and "ranks 0-2 wait in _engine_run_backward" in text


def test_the_rank_in_a_recv_nobody_sends_is_named():
    stacks = [stack(0, BACKWARD), stack(1, RECV), stack(2, BACKWARD), stack(3, BACKWARD)]
    member, text = verdict(stacks, 40, {0: "node 0 (a)"})
    assert member == 0 and text.startswith("rank 1 on node 0 (a) has not stepped")
    assert "in recv (torch/distributed/distributed_c10d.py:2799), from train.py:44" in text


def test_two_ranks_that_differ_the_one_outside_a_collective_is_named():
    stacks = [stack(0, BACKWARD), stack(1, SLEEP)]
    assert [s.rank for s in suspects(stacks)] == [1]


def test_of_the_ranks_outside_the_largest_group_the_one_not_waiting_is_named():
    """4 JAX processes, process 1 asleep: process 0 waits in the step's call, 2 and 3 in the
    next eager operation queued behind theirs (as seen in 2 containers x 2 processes)."""
    stacks = [stack(0, JAX_STEP), stack(1, SLEEP), stack(2, JAX_EAGER), stack(3, JAX_EAGER)]
    assert [s.rank for s in suspects(stacks)] == [1]
    member, text = verdict(stacks, 31, {})
    assert text.startswith("rank 1 on "), text


def test_every_rank_in_one_place_the_one_behind_is_named_else_all():
    behind = [stack(0, BACKWARD, steps=20), stack(1, BACKWARD, steps=19)]
    assert [s.rank for s in suspects(behind)] == [1]
    equal = [stack(0, BACKWARD), stack(1, BACKWARD)]
    member, text = verdict(equal, 50, {})
    assert len(suspects(equal)) == 2 and text.startswith("every rank has been still")


def test_no_stacks_at_all_still_gives_one_line():
    member, text = verdict([], 50, {}, ["node 1 (b)"])
    assert member is None and "node 1 (b) did not answer" in text


# -- torch's Flight Recorder: the collective a rank never entered -------------------------------


def _entry(seq, op="gloo:all_reduce", group=("0", "default_pg"), sizes=((4, 5),), p2p=False):
    """One entry as torch 2.10 and 2.14 dump it (`_dump_fr_trace_json`), the fields read here."""
    return {
        "record_id": seq,
        "process_group": list(group),
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "profiling_name": op,
        "input_sizes": [list(x) for x in sizes],
        "input_dtypes": ["Float"],
        "state": "scheduled",
        "is_p2p": p2p,
        "retired": True,
    }


def test_the_recorder_is_summed_up_as_each_groups_last_collective():
    entries = [
        _entry(1, group=("1", "undefined"), sizes=((3,),)),
        _entry(20),
        _entry(21, op="gloo:broadcast", sizes=((7,),)),
        _entry(5, op="nccl:send", p2p=True),  # point-to-point: not a collective of the group
        _entry(2, group=("1", "undefined"), sizes=((3,),)),
    ]
    assert flight.summary(entries) == [
        ["0", "default_pg", 21, "gloo:broadcast", "float [[7]]"],
        ["1", "undefined", 2, "gloo:all_reduce", "float [[3]]"],
    ]
    assert flight.summary([]) == []


@pytest.mark.parametrize(
    ("reported", "sent"),
    [(77.0, 77.0), (0.0, None), (float("nan"), None), (1e12, None), (-3.0, None)],
)
def test_a_process_group_timeout_node_0_would_refuse_is_not_sent(tmp_path, reported, sent):
    """A rank's timeout outside what node 0 takes (timedelta.max, NaN) would have node 0
    refuse the node's beats: it goes unsaid."""
    inbox = Inbox(tmp_path)
    try:
        inbox.ranks[0] = Rank(0, 0, os.getpid(), steps=3, timeout=reported)
        (row,) = inbox.reports()
        m.Beat.from_wire({"ranks": [row.to_wire()]})  # node 0 takes it
        assert row.timeout == sent, row
    finally:
        inbox.close()


def test_an_answer_node_0_would_refuse_is_dropped_not_sent(tmp_path):
    inbox = Inbox(tmp_path)
    try:
        inbox.ranks[0] = Rank(0, 0, os.getpid())
        for text in ("[[1, 2]]", "not json", '[["0", "d", -1, "op", "x"]]'):
            (tmp_path / f"rank0.pid{os.getpid()}.collectives.json").write_text(text)
            assert inbox.stacks()[0].collectives == (), text
        (tmp_path / f"rank0.pid{os.getpid()}.collectives.json").write_text('[["0","d",1,"o","x"]]')
        assert inbox.stacks()[0].collectives == (Collective("0", "d", 1, "o", "x"),)
        # a long name given by the trainer, and more groups than node 0 takes: cut, then taken
        named = flight.summary(
            [_entry(3, group=(str(g), "x" * 500), op="gloo:" + "y" * 500) for g in range(20)]
        )
        (tmp_path / f"rank0.pid{os.getpid()}.collectives.json").write_text(json.dumps(named))
        taken = inbox.stacks()[0].collectives
        check_collectives([[c.group, c.description, c.seq, c.op, c.detail] for c in taken])
        assert len(taken) == 16 and taken[0].description == "x" * 128
        assert taken[0].op == "gloo:" + "y" * 123
    finally:
        inbox.close()


def _with(s, *collectives):
    return RankStack(s.member, s.host, s.rank, s.steps, s.frames, tuple(collectives))


def _last(seq, group="0", desc="default_pg", op="gloo:all_reduce", detail="float [[4,5]]"):
    return Collective(group, desc, seq, op, detail)


def test_the_recorder_names_the_collective_the_sleeping_rank_never_entered():
    stacks = [_with(stack(r, BACKWARD), _last(21)) for r in range(3)]
    stacks.append(_with(stack(3, SLEEP), _last(20)))
    member, text = verdict(stacks, 31, {1: "node 1 (b)"})
    assert member == 1 and text.startswith("rank 3 on node 1 (b) has not stepped for 31 s")
    assert text.endswith(
        ". torch's Flight Recorder: rank 3 never entered collective #21 (gloo:all_reduce, "
        "float [[4,5]]) of process group 0 (default_pg), which ranks 0-2 entered; last "
        "entered: #20 by rank 3"
    ), text


def test_the_recorder_picks_the_group_where_the_named_rank_is_behind():
    sub = {"group": "1", "desc": "undefined"}
    stacks = [
        _with(stack(0, BACKWARD), _last(9), _last(4, **sub)),
        _with(stack(1, BACKWARD), _last(8), _last(4, **sub)),  # behind on group 0 only
        _with(stack(2, BACKWARD), _last(9), _last(5, **sub)),
        _with(stack(3, SLEEP), _last(9), _last(3, **sub)),
    ]
    text = never_entered(stacks, [stacks[3]])
    assert "ranks 1, 3" not in text and "never entered collective #5" in text, text
    assert (
        "of process group 1, which rank 2 entered; last entered: #3 by rank 3, #4 by ranks 0-1"
        in text
    )


def test_the_recorder_says_the_wait_is_inside_only_when_every_rank_waits_in_it():
    inside = [_with(stack(r, BACKWARD), _last(21, op="nccl:all_reduce")) for r in range(4)]
    assert never_entered(inside, []).endswith(
        "#21 (nccl:all_reduce, float [[4,5]]) of "
        "process group 0 (default_pg) last: the wait is inside it"
    )
    asleep = [_with(stack(r, SLEEP), _last(21)) for r in range(2)]  # all outside collectives
    assert never_entered(asleep, []) == ""
    one_silent = inside[:3] + [stack(3, BACKWARD)]  # rank 3 gave no record: it may be behind
    assert never_entered(one_silent, []) == ""
    assert never_entered([stack(r, BACKWARD) for r in range(2)], []) == ""  # JAX: no recorder


def test_the_recorder_names_ranks_that_gave_no_record():
    stacks = [_with(stack(0, BACKWARD), _last(7)), _with(stack(1, SLEEP), _last(6))]
    stacks.append(stack(2, BACKWARD))
    assert never_entered(stacks, [stacks[1]]).endswith("#6 by rank 1; rank 2 gave no record")


# -- slow ranks ---------------------------------------------------------------------------------


def _sampled(leads_by_rank, seconds=60, every=5):
    p = JobProgress()
    for t in range(0, seconds + 1, every):
        p.beat(0, [RankReport(r, t + 1, 0, lead, 0.1) for r, lead in leads_by_rank.items()], t)
    return p


def test_a_rank_every_step_waits_for_is_named():
    p = _sampled({0: 0.01, 1: 0.012, 2: 0.011, 3: 0.3})
    slow = slow_ranks(p.ranks.values(), 60, 50)
    assert list(slow) == [(0, 3)] and "0.300 s a step of its own work" in slow[(0, 3)]


def test_with_the_default_window_and_a_beat_a_second_the_slow_rank_is_named():
    """Beats come every second; the default window is 120 s. Every beat's lead was a sample, 64
    kept: 63 s of them, never the 72 s a judgement needs, so nobody was ever named."""
    p = JobProgress()
    leads = {0: 0.01, 1: 0.011, 2: 0.012, 3: 0.51}  # rank 3: 0.5 s slower every step
    named = None
    for t in range(0, 181):
        p.beat(0, [RankReport(r, t + 1, 0, lead, 0.1) for r, lead in leads.items()], t, 120)
        if named is None and slow_ranks(p.ranks.values(), t, 120):
            named = t
    assert named is not None and 72 <= named <= 80, named
    assert list(slow_ranks(p.ranks.values(), 180, 120)) == [(0, 3)]


def test_equal_ranks_are_never_named():
    p = _sampled({0: 0.05, 1: 0.052, 2: 0.049, 3: 0.051})
    assert slow_ranks(p.ranks.values(), 60, 50) == {}


# -- the wire -----------------------------------------------------------------------------------


def test_a_beat_carries_its_ranks_and_stacks_come_back():
    beat = m.Beat(NodeStats(), (RankReport(3, 120, 0.5, 0.01, 0.2),))
    back = m.decode(m.encode(beat))
    assert isinstance(back, m.Beat) and back.reports() == [RankReport(3, 120, 0.5, 0.01, 0.2)]
    for report in (
        RankReport(3, 120, 0.5, None, 0.2, False, None, 40.0),
        RankReport(3, 120, 0.5, None, 0.2, True, 2.5, 1800.0),
        RankReport(3, 120, 0.5, None, 0.2, False, 2.5),
    ):
        wired = m.Beat(NodeStats(), (report,))
        assert m.decode(m.encode(wired)).reports() == [report]
    stacks = m.Stacks((RankDump(3, 20, (Frame("t.py", 4, "main", "x()"),)),))
    got = m.decode(m.encode(stacks))
    assert isinstance(got, m.Stacks)
    assert got.stacks(1, "h")[0].frames == (Frame("t.py", 4, "main", "x()"),)
    assert isinstance(m.decode(m.encode(m.Dump(31.0)), m.FROM_NODE_0), m.Dump)
    with_recorder = m.Stacks((RankDump(3, 20, (), (Collective("0", "pg", 7, "op", "d"),)),))
    (back_stack,) = m.decode(m.encode(with_recorder)).stacks(1, "h")
    assert back_stack.collectives == (Collective("0", "pg", 7, "op", "d"),)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"t":"beat","ranks":[[1,2,3]]}',
        b'{"t":"beat","ranks":[[1,-2,0,null,0,0]]}',
        b'{"t":"beat","ranks":"x"}',
        b'{"t":"beat","ranks":[[1,2,0,null,0,0,null,0]]}',  # a timeout of 0 s
        b'{"t":"beat","ranks":[[1,2,0,null,0,0,null,-5]]}',
        b'{"t":"beat","ranks":[[1,2,0,null,0,0,null,"600"]]}',
        b'{"t":"beat","ranks":[[1,2,0,null,0,0,null,1e12]]}',
        b'{"t":"beat","ranks":[[1,2,0,null,0,0,null,60,1]]}',
        b'{"t":"stacks","ranks":[{"rank":1,"steps":2,"frames":[[1,2,3,4]]}]}',
        b'{"t":"stacks","ranks":[{"rank":1,"steps":2,"frames":' + b'[["f",1,"g",""]' * 1 + b"]}]}x",
        b'{"t":"dump"}',  # node 0's message, not a node's
        b'{"t":"stacks","ranks":[{"rank":1,"steps":2,"frames":[],"collectives":[["0","p",-1,"o","d"]]}]}',
        b'{"t":"stacks","ranks":[{"rank":1,"steps":2,"frames":[],"collectives":[["0","p",1,"o"]]}]}',
        b'{"t":"stacks","ranks":[{"rank":1,"steps":2,"frames":[],"collectives":{"0":1}}]}',
    ],
)
def test_bad_progress_messages_are_refused(raw):
    with pytest.raises(BadMessage):
        m.decode(raw)


# -- the Conductor: a hang, asked for stacks, named, acted on -----------------------------------


def _running(max_restarts=0):
    c = Conductor(2, Limits(hang_timeout=10, max_restarts=max_restarts), 0.0)
    for member in (0, 1):
        c.hello(member, m.Hello(member, f"host{member}", Fingerprint(), 0.0), 0.0, 0.0)
    assert c.job.phase == "run"
    return c


def _beat(c, member, steps, now, age=0.0):
    ranks = tuple(RankReport(member * 2 + r, steps, age, 0.01, 0.1) for r in range(2))
    return c.beat(member, m.Beat(NodeStats(), ranks), now)


def _stacks(member, frames_by_rank):
    return m.Stacks(tuple(RankDump(r, 20, tuple(fr)) for r, fr in frames_by_rank.items()))


def test_the_first_step_of_each_start_is_said_once_with_its_time_after_the_go():
    c = Conductor(2, Limits(hang_timeout=10, max_restarts=1), 0.0)
    for member in (0, 1):
        c.hello(member, m.Hello(member, f"host{member}", Fingerprint(), 0.0), 2.0, 2.0)
    assert [a for a in _beat(c, 1, 0, 3.0) if isinstance(a, Log)] == []  # not stepping yet
    said = [a.text for a in _beat(c, 1, 2, 9.5) if isinstance(a, Log)]
    assert said == [
        "training: rank 2 on node 1 (host1) made the job's first step, 7.5 s after the go"
    ]
    assert not [a for t in (10.0, 11.0) for a in _beat(c, 0, 3, t) if isinstance(a, Log)]
    c.job.next_start({0, 1}, 20.0)  # a restart: said again, of that start
    for member in (0, 1):
        c.hello(member, m.Hello(member, f"host{member}", Fingerprint(), 20.0), 21.0, 21.0)
    said = [a.text for a in _beat(c, 0, 1, 25.0) if isinstance(a, Log)]
    assert said == [
        "training: rank 0 on node 0 (host0) made restart 1's first step, 4.0 s after the go"
    ]


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_conductor_names_the_hung_rank_and_stops_or_restarts(max_restarts):
    c = _running(max_restarts)
    for member in (0, 1):
        _beat(c, member, 20, 1.0)
    assert not [a for a in c.tick(8.0) if isinstance(a, Send)]
    asked = [a for a in c.tick(12.0) if isinstance(a, Send)]
    assert asked == [Send(ALL, m.Dump(11.0))]
    assert c.stacks(0, _stacks(0, {0: BACKWARD, 1: BACKWARD}), 13.0) == []
    actions = c.stacks(1, _stacks(1, {2: BACKWARD, 3: SLEEP}), 13.0)
    sent = [a.message for a in actions if isinstance(a, Send)]
    if max_restarts:
        assert isinstance(sent[0], m.Restart) and "rank 3 on node 1 (host1)" in sent[0].reason
    else:
        assert sent[0].code == EXIT_HUNG and "rank 3 on node 1 (host1)" in sent[0].reason


def test_conductor_judges_without_a_node_that_never_answers():
    c = _running()
    for member in (0, 1):
        _beat(c, member, 20, 1.0)
    c.tick(12.0)
    c.stacks(0, _stacks(0, {0: BACKWARD, 1: SLEEP}), 12.5)
    actions = c.tick(18.0)  # STACKS_WAIT later
    (stop,) = [a.message for a in actions if isinstance(a, Send)]
    assert stop.code == EXIT_HUNG and "node 1 (host1) sent no stacks" in stop.reason


@pytest.mark.parametrize("crash_at", [11.5, 12.5])  # before the stacks are asked for, or after
def test_a_crash_awaiting_its_verdict_is_named_not_a_hang(crash_at):
    """Rank 2 aborts (a collective mismatch) and its peers stop stepping: the crash, reported
    within the failure window, is the cause; the stacks arriving meanwhile name no hang."""
    c = Conductor(2, Limits(hang_timeout=10, failure_window=2), 0.0)
    for member in (0, 1):
        c.hello(member, m.Hello(member, f"host{member}", Fingerprint(), 0.0), 0.0, 0.0)
        _beat(c, member, 20, 1.0)
    crash = m.Exit(134, reason="node 1 (host1): rank 2 failed with exit code 134")
    if crash_at < 12:
        assert c.exited(1, crash, crash_at) == []
    assert [a for a in c.tick(12.0) if isinstance(a, Send)] == (
        [] if crash_at < 12 else [Send(ALL, m.Dump(11.0))]
    )
    if crash_at > 12:
        assert c.exited(1, crash, crash_at) == []
    assert c.stacks(0, _stacks(0, {0: BACKWARD, 1: BACKWARD}), 13.0) == []
    assert c.stacks(1, _stacks(1, {3: BACKWARD}), 13.0) == []
    stops = [a.message for t in (13.2, crash_at + 2.1) for a in c.tick(t) if isinstance(a, Send)]
    assert [(s.code, s.reason) for s in stops] == [(134, crash.reason)], stops


def _conductor(hang_timeout):
    c = Conductor(2, Limits(hang_timeout=hang_timeout), 0.0)
    for member in (0, 1):
        c.hello(member, m.Hello(member, f"host{member}", Fingerprint(), 0.0), 0.0, 0.0)
    return c


def _timed_beat(c, member, steps, now, timeout=40.0, age=0.0):
    ranks = tuple(
        RankReport(member * 2 + r, steps, age, 0.01, 0.1, False, None, timeout) for r in range(2)
    )
    return c.beat(member, m.Beat(NodeStats(), ranks), now)


def test_the_trainers_process_group_timeout_is_beaten_by_the_hang_probe():
    """No ENTRYPOINT_HANG_TIMEOUT, the trainer's process group times out after 40 s: the ranks
    are asked for their stacks at 30 s (before warm-up too), not at the 450 s cap."""
    c = _conductor(None)
    for now in (1.0, 11.0, 21.0, 31.0):  # alive, no step since 1.0
        for member in (0, 1):
            _timed_beat(c, member, 5, now, age=now - 1.0)
    assert not [a for a in c.tick(30.0) if isinstance(a, Send)]
    actions = c.tick(31.5)
    assert [a for a in actions if isinstance(a, Send)] == [Send(ALL, m.Dump(30.5))]
    (said,) = [a.text for a in actions if not isinstance(a, Send)]
    assert "process-group timeout (40 s)" in said, said


def test_a_hang_setting_torchs_own_timeout_fires_before_is_warned_once():
    c = _conductor(60)
    warning, first = _timed_beat(c, 0, 5, 1.0)
    assert first.text.startswith("training: rank 0 on node 0 (host0) made the job's first step")
    assert warning.level == "warning" and warning.text.startswith(
        "ENTRYPOINT_HANG_TIMEOUT=60 is not below the trainer's process-group timeout (40 s"
    ), warning
    assert _timed_beat(c, 1, 5, 1.0) == [] and _timed_beat(c, 0, 6, 2.0) == []
    below = _conductor(30)
    assert [a.level for a in _timed_beat(below, 0, 5, 1.0)] == ["info"]  # the first step alone


# -- the site hook in a real torch process, reporting to a real inbox ----------------------------

TRAINER = textwrap.dedent(
    """
    import os, sys, time, torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(int(sys.argv[1])):
        time.sleep(0.02)
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
    torch.save(model.state_dict(), sys.argv[2])
    print("ready", flush=True)
    time.sleep(60)  # waiting here: the test asks for its stack
    """
)


def test_the_site_hook_reports_steps_saves_and_its_stack(tmp_path):
    inbox = Inbox(tmp_path / "stacks")
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    env = dict(os.environ) | inbox.env() | {"RANK": "5", "LOCAL_RANK": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(jax_cluster.SITE_HOOK), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, str(script), "30", str(tmp_path / "m.pt")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        rank = inbox.ranks[5]
        assert (rank.steps, rank.local_rank, rank.pid, rank.saving) == (30, 1, proc.pid, False)
        (report,) = inbox.reports()
        assert report.rank == 5 and report.steps == 30
        assert report.lead is not None and report.lead >= 0.015  # the sleep before backward
        inbox.dump(time.monotonic())
        time.sleep(1.0)
        (answer,) = inbox.stacks()
        top = answer.frames[0]
        assert (
            top.file == str(script)
            and top.source
            == "time.sleep(60)  # waiting here: the test asks for its stack"[: len(top.source)]
        )
    finally:
        proc.kill()
        proc.wait()
        inbox.close()


STRAGGLER = textwrap.dedent(
    """
    import datetime, os, sys, time, torch, torch.distributed as dist
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=sys.argv[1], rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=77))
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):  # DDP's work by hand: 2 all-reduces a step
        model(torch.randn(2, 4)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
    print("stepped", flush=True)
    if rank == 1:
        time.sleep(60)  # never enters the next collective
    else:
        dist.all_reduce(torch.ones(5, 3))  # waits for rank 1
    """
)


def _stop(pid: int) -> None:
    """SIGSTOP `pid` and wait until every thread of it has stopped: the kernel stops the other
    threads only once the one it chose takes the signal, and under load the recorder's thread
    could answer in between (CI's run of stop 64)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
            except OSError:
                continue
        if states and all(s in "Tt" for s in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} did not stop in 10 s: {states}")


def test_each_rank_answers_with_its_recorder_and_the_one_behind_is_named(tmp_path):
    """Two real gloo ranks with the site hook and the plan's TORCH_FR_BUFFER_SIZE: rank 1 sleeps
    after 3 steps, rank 0 waits in the next all-reduce. Asked, each writes its process group's
    last collective from torch's Flight Recorder; node 0's verdict names #7 as the one rank 1
    never entered. Rank 0 answers from inside its all-reduce (the thread, not a signal)."""
    inbox = Inbox(tmp_path / "stacks")
    script = tmp_path / "train.py"
    script.write_text(STRAGGLER)
    procs = []
    init = f"tcp://127.0.0.1:{free_ports()}"
    try:
        for rank in (0, 1):
            env = dict(os.environ) | inbox.env() | {"RANK": str(rank), "LOCAL_RANK": str(rank)}
            env |= {"TORCH_FR_BUFFER_SIZE": "2000"}
            env["PYTHONPATH"] = os.pathsep.join(
                [str(jax_cluster.SITE_HOOK), env.get("PYTHONPATH", "")]
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), init], env=env, stdout=subprocess.PIPE, text=True
                )
            )
        assert [p.stdout.readline().strip() for p in procs] == ["stepped", "stepped"]
        time.sleep(0.5)
        assert sorted(inbox.ranks) == [0, 1]
        # each rank's report carries its process group's timeout (the hang is named below it)
        assert [row.timeout for row in inbox.reports()] == [77.0, 77.0]
        inbox.dump(time.monotonic())
        time.sleep(1.0)
        answers = inbox.stacks()
        assert [a.collectives for a in answers] == [
            (Collective("0", "default_pg", 7, "gloo:all_reduce", "float [[5,3]]"),),
            (Collective("0", "default_pg", 6, "gloo:all_reduce", "float [[1]]"),),
        ], answers
        stacks = m.decode(m.encode(m.Stacks(tuple(answers)))).stacks(0, "h")
        member, text = verdict(stacks, 31, {0: "node 0 (h)"})
        assert text.startswith(
            "rank 1 on node 0 (h) has not stepped for 31 s: in train.py:15 (time.sleep(60)"
        )
        assert "rank 1 never entered collective #7 (gloo:all_reduce, float [[5,3]])" in text
        # asked again while rank 1 cannot answer (stopped): its last answer is not taken as new
        _stop(procs[1].pid)
        inbox.dump(time.monotonic())
        time.sleep(1.0)
        again = inbox.stacks()
        assert again[0].collectives and not again[1].collectives, again
        os.kill(procs[1].pid, signal.SIGCONT)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        inbox.close()


EVALUATOR = textwrap.dedent(
    """
    import sys, time, torch
    nn = torch.nn
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def train(steps):
        model.train()
        model[1].eval()  # a frozen BatchNorm, kept in eval mode while training
        for _ in range(steps):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
    from entrypoint.trainer_side import step_hook as progress
    train(5)
    print("trained", len(progress._watched), flush=True)
    model.eval()
    with torch.no_grad():
        end = time.monotonic() + float(sys.argv[1])
        while time.monotonic() < end:  # an evaluation: forward passes, no step
            model(torch.randn(8, 4))
            time.sleep(0.05)
    print("evaluated", len(progress._watched), flush=True)
    train(1)
    print("trained again", len(progress._watched), flush=True)
    time.sleep(60)
    """
)


def test_the_site_hook_counts_forward_passes_in_evaluation_and_leaves_training_alone(tmp_path):
    """A real torch process with the site hook: after `model.eval()`, its forward passes (no
    gradients) move the rank's last activity while its steps stay 5; the hooks are gone once it
    trains again, and a BatchNorm kept in eval mode inside training is not watched."""
    inbox = Inbox(tmp_path / "stacks")
    script = tmp_path / "evaluate.py"
    script.write_text(EVALUATOR)
    env = dict(os.environ) | inbox.env() | {"RANK": "0", "LOCAL_RANK": "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(jax_cluster.SITE_HOOK), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, str(script), "2.5"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        # the frozen BatchNorm's hook went at its first forward with gradients
        assert proc.stdout.readline().split() == ["trained", "0"]
        began = time.monotonic()
        time.sleep(2.0)
        rank = inbox.ranks[0]
        assert rank.steps == 5 and began < rank.active <= time.monotonic()
        # progress reported at most once a second: 1 s and more after the last step
        assert rank.active - rank.last_step > 0.8
        (report,) = inbox.reports()
        assert report.steps == 5 and report.evaluated is not None and report.evaluated < 1.5
        assert proc.stdout.readline().split() == ["evaluated", "4"]  # the model, its 3 children
        assert proc.stdout.readline().split() == ["trained", "again", "0"]
    finally:
        proc.kill()
        proc.wait()
        inbox.close()


def test_without_the_entrypoint_the_hook_costs_nothing_and_says_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTRYPOINT_")}
    env["PYTHONPATH"] = str(jax_cluster.SITE_HOOK)
    code = "import torch, entrypoint.progress as p; p.step(); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "ok\n" and out.stderr == ""


def test_a_report_to_an_entrypoint_that_is_gone_is_dropped(tmp_path):
    inbox = Inbox(tmp_path)
    env = dict(os.environ) | inbox.env()
    inbox.close()  # nobody listens
    env["PYTHONPATH"] = str(jax_cluster.SITE_HOOK)
    code = "import entrypoint.progress as p\nfor _ in range(1000): p.step()\nprint('ok')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


def test_main_stack_reads_the_main_thread_of_the_last_dump(tmp_path):
    code = textwrap.dedent(
        f"""
        import faulthandler, threading, time, signal
        f = open({str(tmp_path / "d.txt")!r}, 'w', buffering=1)
        f.write('main thread 0x%016x\\n' % threading.main_thread().ident)
        faulthandler.register({int(DUMP_SIGNAL)}, file=f, all_threads=True)
        def other():
            time.sleep(60)
        threading.Thread(target=other, daemon=True).start()
        print('ready', flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        for _ in range(2):  # two dumps: the last one is read
            os.kill(proc.pid, DUMP_SIGNAL)
            time.sleep(0.5)
    finally:
        proc.kill()
        proc.wait()
    frames = main_stack((tmp_path / "d.txt").read_text())
    assert [f[2] for f in frames] == ["<module>"]  # not the other thread's `other`
    assert main_stack("") == [] and main_stack("garbage\n\n") == []
    assert signal.SIGRTMIN < DUMP_SIGNAL < signal.SIGRTMAX


ASKS = 10  # 1 s each (DUMP_WAIT)
BUSY = textwrap.dedent(
    """
    import json, sys, threading, time, torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    dist.all_reduce(model.weight.grad)
    opt.step()
    def inner(x):
        return [x] * 2
    def outer(x):
        return inner(x) + inner(x + 1)
    def busy():  # a thread of the trainer's that runs Python all the time (a logger, a loader)
        data = [{"k": list(range(50))} for _ in range(20)]
        while True:  # its frames come and go without pause
            json.dumps(data)
            for i in range(200):
                outer(i)
    threading.Thread(target=busy, daemon=True).start()
    print("stepped", flush=True)
    time.sleep(120)  # waiting here
    """
)


def test_asked_again_and_again_while_another_thread_runs_python_the_rank_answers_and_lives(
    tmp_path,
):
    """faulthandler's signal handler read every thread's frames while the rank's own recorder
    thread was encoding its answer, and the rank died of SIGSEGV (2026-12-07, a hang test on
    loopback: node 0 then named the crash, not the hang). The stacks are now written by the
    rank's thread holding the GIL, then its answer. Asked ASKS times while a thread of its own
    runs Python without pause, the rank lives and every answer has its main thread's stack."""
    inbox = Inbox(tmp_path / "stacks")
    script = tmp_path / "train.py"
    script.write_text(BUSY)
    env = dict(os.environ) | inbox.env() | {"RANK": "0", "LOCAL_RANK": "0"}
    env |= {"TORCH_FR_BUFFER_SIZE": "2000"}
    env["PYTHONPATH"] = os.pathsep.join([str(jax_cluster.SITE_HOOK), env.get("PYTHONPATH", "")])
    init = f"tcp://127.0.0.1:{free_ports()}"
    proc = subprocess.Popen(
        [sys.executable, str(script), init], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "stepped"
        time.sleep(0.3)
        for _ in range(ASKS):
            inbox.dump(time.monotonic())
            while not inbox.dump_ready(time.monotonic()):
                time.sleep(0.05)
            (answer,) = inbox.stacks()
            assert proc.poll() is None, f"the rank died: {proc.returncode}"
            assert answer.frames and answer.frames[0].source.startswith("time.sleep(120)"), answer
            assert answer.collectives, answer
    finally:
        proc.kill()
        proc.wait()
        inbox.close()
