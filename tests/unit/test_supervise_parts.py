"""Parts of the supervisor's edge, each with real files, pipes and processes: the log writer
that never blocks (a pipe nobody reads, a full disk), the tail of a long rank log, the pruning
of torchrun's log directories, exit statuses within 0-255."""

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from entrypoint.control.rank_records import Failure
from entrypoint.supervise import failures, launcher_process, logs
from entrypoint.supervise.launcher_process import exit_status


def test_the_log_writer_never_blocks_on_a_pipe_nobody_reads_and_counts_what_it_drops():
    read, write = os.pipe()
    writer = logs.Writer(None, fd=write, size=100)
    try:
        began = time.monotonic()
        for i in range(20000):  # ~2 MB: far more than a pipe holds (64 kB)
            writer.put(f"line {i} " + "x" * 100)
        assert time.monotonic() - began < 2  # the callers never waited for the pipe
        assert writer.dropped_total > 19000
        os.set_blocking(read, False)
        data = b""

        def drain():
            nonlocal data
            try:
                data += os.read(read, 1 << 20)
            except BlockingIOError:
                time.sleep(0.01)

        end = time.monotonic() + 10
        while not writer.flush(0.01) and time.monotonic() < end:  # now someone reads
            drain()
        writer.put("after")
        while not data.endswith(b"after\n") and time.monotonic() < end:
            drain()
        assert b"log line(s) dropped: stderr was not being read fast enough" in data
        assert data.endswith(b"after\n")
    finally:
        os.close(read)
        os.close(write)


def test_a_full_disk_is_said_once_and_the_writer_goes_on(tmp_path):
    (tmp_path / "node0.log").symlink_to("/dev/full")
    read, write = os.pipe()
    writer = logs.Writer(tmp_path / "node0.log", fd=write)
    try:
        for i in range(5):
            writer.put(f"line {i}")
        assert writer.flush(5)
        os.set_blocking(read, False)
        out = os.read(read, 1 << 20).decode()
        assert out.count("No space left on device") == 1 and "line 4" in out
    finally:
        os.close(read)
        os.close(write)


def test_the_summary_reads_only_the_tail_of_a_long_rank_log(tmp_path):
    path = tmp_path / "stderr.log"
    with path.open("w") as f:
        for i in range(200000):  # ~3 MB
            f.write(f"noise line {i}\n")
        f.write("Traceback (most recent call last):\nValueError: the real error\n")
    assert failures.tail(path, 2) == [
        "Traceback (most recent call last):",
        "ValueError: the real error",
    ]
    assert len(failures.tail(path, 10**6)) < 5000  # at most 64 kB were read


def test_restarts_keep_only_the_last_log_directories(tmp_path):
    for i in range(6):
        (tmp_path / f"run{i}" / "attempt_0").mkdir(parents=True)
        os.utime(tmp_path / f"run{i}", (1000 + i, 1000 + i))
    failures.prune(tmp_path, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run4", "run5"]  # + the next start's


@pytest.mark.parametrize(
    "returncode,status", [(0, 0), (3, 3), (255, 255), (-6, 134), (-9, 137), (-15, 143), (134, 134)]
)
def test_exit_statuses_are_the_shells_and_within_0_255(returncode, status):
    assert exit_status(returncode) == status


def _through_a_pipe(chunks: list[bytes]) -> tuple[list[str], int]:
    """What the relay makes of `chunks` written to a real pipe by another thread, and the
    peak of memory allocated while reading them."""
    import threading
    import tracemalloc

    from entrypoint.supervise import launcher_process

    read_end, write_end = os.pipe()

    def write() -> None:
        with os.fdopen(write_end, "wb", buffering=0) as out:
            for chunk in chunks:
                out.write(chunk)

    writer = threading.Thread(target=write, daemon=True)
    tracemalloc.start()
    writer.start()
    with os.fdopen(read_end, "rb") as stream:
        lines = list(launcher_process._kept_lines(stream, collections.deque(maxlen=400)))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    writer.join()
    return lines, peak


def test_a_trainer_line_without_end_cannot_grow_the_entrypoint():
    """Issue 28: 32 MiB with no newline: the relay keeps the first 64 KiB of the line and says
    how much more it dropped; memory stays bounded (the whole line was held before)."""
    mib = b"x" * (1 << 20)
    lines, peak = _through_a_pipe([mib] * 32 + [b"\nnext\n"])
    assert len(lines) == 2 and lines[1] == "next"
    assert lines[0] == "x" * (64 << 10) + (
        f" [entrypoint: {(32 << 20) - (64 << 10):,} more bytes of this line dropped]"
    )
    assert peak < 4 << 20, peak


def test_a_carriage_return_ends_a_line_so_progress_bars_show():
    lines, _ = _through_a_pipe([b"step 1/3\rstep 2/3\r", b"\nstep 3/3\r\n", b"done\n\nlast"])
    assert lines == ["step 1/3", "step 2/3", "step 3/3", "done", "", "last"]


def test_the_launchers_end_is_noted_when_it_happens_and_popen_still_reads_its_code():
    """CI, 2026-11-28: a node saw its SIGKILLed torchrun a second late under load and reported
    that later time; node 0 then named a rank on another node, which failed because of it, as
    the first failure. The launch notes the launcher's end as it happens, without collecting
    it."""
    process = subprocess.Popen(["sleep", "30"])
    launch = launcher_process.LauncherProcess(process, True, collections.deque(), time.monotonic())
    noting = threading.Thread(target=launcher_process._note_end, args=(launch,), daemon=True)
    noting.start()
    time.sleep(0.3)
    assert launch.ended_at is None
    killed = time.time()
    os.kill(process.pid, signal.SIGKILL)
    time.sleep(1.5)  # the node's loop a turn late: it has not looked yet
    noting.join(timeout=5)
    assert launch.ended_at is not None and killed <= launch.ended_at < killed + 0.5
    assert process.poll() == -signal.SIGKILL  # left for Popen to collect, with its code


FIRST_THEN_PEER = """
import os, sys, time, traceback
told = os.path.join(os.path.dirname(os.path.abspath(__file__)), "failed")
if os.environ["LOCAL_RANK"] == "1":
    try:
        raise ValueError("the first failure")
    except ValueError:
        traceback.print_exc()
        sys.stderr.flush()
    open(told, "w").close()
    sys.exit(1)
while not os.path.exists(told):  # however slowly each started on a loaded machine
    time.sleep(0.005)
time.sleep(float(sys.argv[1]))  # a peer that fails because of it, a moment later
raise RuntimeError("Connection closed by peer")
"""


def _torchrun_failure(tmp_path: Path, trainer: str, *args: str) -> tuple[Failure, str]:
    """`trainer` run by a real torchrun with 2 workers, and the failure the node reports of it,
    with torchrun's stderr."""
    script = tmp_path / "train.py"
    script.write_text(trainer)
    log_dir = tmp_path / "logs"
    process = subprocess.Popen(
        [
            *(str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node=2"),
            *(f"--log-dir={log_dir}", "--redirects=3", str(script), *args),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = process.communicate(timeout=120)
    launch = launcher_process.LauncherProcess(
        process, True, collections.deque(err.splitlines()), 0.0
    )
    return failures.failure(None, launch, process.returncode, log_dir), err  # type: ignore[arg-type]


@pytest.mark.parametrize("later", [0.05, 0.3])
def test_the_rank_that_failed_first_is_named_not_the_lower_rank_torchrun_names(tmp_path, later):
    """torchrun's failure timestamps are whole seconds: two ranks that fail within one of its
    polls tie, and it names the lower rank as root cause. The entrypoint names the rank whose
    error was written first."""
    found, err = _torchrun_failure(tmp_path, FIRST_THEN_PEER, str(later))
    assert "Root Cause (first observed failure):" in err, err
    assert (found.rank, found.local_rank, found.exitcode) == (1, 1, 1), err
    assert "ValueError: the first failure" in found.tail


CRASH_WRITES_LAST = """
import os, sys, time, traceback
here = os.path.dirname(os.path.abspath(__file__))
if os.environ["LOCAL_RANK"] == "1":
    try:
        raise ValueError("the first failure")
    except ValueError:
        traceback.print_exc()
        sys.stderr.flush()
    open(os.path.join(here, "failed"), "w").close()
    while not os.path.exists(os.path.join(here, "peer-said")):
        time.sleep(0.005)
    time.sleep(0.05)
    print("a warning written at exit, after the peer's error", file=sys.stderr)
    sys.stderr.flush()
    open(os.path.join(here, "warned"), "w").close()
    sys.exit(1)
while not os.path.exists(os.path.join(here, "failed")):
    time.sleep(0.005)
print("RuntimeError: [gloo/transport/tcp/pair.cc:547] Connection closed by peer", file=sys.stderr)
sys.stderr.flush()
open(os.path.join(here, "peer-said"), "w").close()
while not os.path.exists(os.path.join(here, "warned")):  # both end within one of torchrun's polls
    time.sleep(0.001)
sys.exit(1)
"""


def test_the_crash_is_named_when_it_wrote_last_and_its_peer_said_it_lost_a_peer(tmp_path):
    """Under load, the crash's exit-time writes can land after its peer's error: the rank whose
    own lines say it lost a peer is not the root cause."""
    found, err = _torchrun_failure(tmp_path, CRASH_WRITES_LAST)
    assert (found.rank, found.local_rank, found.exitcode) == (1, 1, 1), err
    assert "ValueError: the first failure" in found.tail and not found.peer_lost


CRASH_LEAVES_AFTER_THE_CLOSING_SIGNAL = """
import os, signal, sys, time, traceback
here = os.path.dirname(os.path.abspath(__file__))
if os.environ["LOCAL_RANK"] == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # busy shutting down: torchrun's signal waits
    try:
        raise ValueError("the first failure")
    except ValueError:
        traceback.print_exc()
        sys.stderr.flush()
    open(os.path.join(here, "failed"), "w").close()
    while not os.path.exists(os.path.join(here, "peer-said")):
        time.sleep(0.005)
    time.sleep(1)
    sys.exit(1)
while not os.path.exists(os.path.join(here, "failed")):
    time.sleep(0.005)
print("RuntimeError: [gloo/transport/tcp/pair.cc:547] Connection closed by peer", file=sys.stderr)
sys.stderr.flush()
open(os.path.join(here, "peer-said"), "w").close()
sys.exit(1)
"""


def test_the_crash_is_named_when_it_exits_after_torchruns_closing_signal(tmp_path):
    """CI, stop 59: the peer that lost the crash exited first; torchrun sent its closing signal
    to the crash, still shutting down, which then exited with its own code 1. A worker sent the
    signal but not ended by it failed by itself: it is weighed, and named (it did not only lose
    a peer). Made certain here: the crash ignores the signal and leaves 1 s after its peer."""
    found, err = _torchrun_failure(tmp_path, CRASH_LEAVES_AFTER_THE_CLOSING_SIGNAL)
    assert "closing signal" in err, err
    assert (found.rank, found.local_rank, found.exitcode) == (1, 1, 1), err
    assert "ValueError: the first failure" in found.tail and not found.peer_lost


def test_the_crash_torchrun_stopped_before_it_exited_is_named_when_its_peer_only_lost_it(
    tmp_path,
):
    """Under load (make test-unit, 2026-12-06): the peer that lost the crash exited 1 first, and
    torchrun's closing SIGTERM ended the crash (-15) before it exited by itself. The only failure
    left to weigh says it lost a peer; the stopped worker's own stderr ends in its traceback: it
    is the crash, named with the launch's exit code."""
    run = tmp_path / "run0" / "attempt_0"
    for local, lines in {
        0: "RuntimeError: [gloo/transport/tcp/pair.cc:547] Connection closed by peer\n",
        1: 'Traceback (most recent call last):\n  File "train.py"\nValueError: the first failure\n',
    }.items():
        (run / str(local)).mkdir(parents=True)
        (run / str(local) / "stderr.log").write_text(lines)
    table = """Sending process 11 closing signal SIGTERM
Failures:
[1]:
  rank      : 3 (local_rank: 1)
  exitcode  : -15 (pid: 11)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 10)
============================================================""".splitlines()
    launch = launcher_process.LauncherProcess(None, True, collections.deque(table), 0.0)  # type: ignore[arg-type]
    assert failures._root_cause(None, launch, table, 1, tmp_path) == (3, 1, 1)  # type: ignore[arg-type]
    # a stopped worker with no error of its own (it was training) is not: the peer stays named
    (run / "1" / "stderr.log").write_text("step 20\n")
    assert failures._root_cause(None, launch, table, 1, tmp_path) == (2, 0, 1)  # type: ignore[arg-type]


def test_a_rank_that_lost_a_peer_says_so_in_its_own_words():
    assert failures.lost_a_peer(["RuntimeError: [pair.cc:547] Connection reset by peer [::1]:5"])
    assert failures.lost_a_peer(["NCCL error: remote process exited or there was a network error"])
    assert failures.lost_a_peer(["rank 1: a peer left the collective (connection closed)"])
    assert not failures.lost_a_peer(["ValueError: injected failure on rank 3 at step 15"])


def test_a_lone_failure_in_torchruns_table_is_its_root_cause():
    table = """Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_15:53:48
  rank      : 5 (local_rank: 1)
  exitcode  : -9 (pid: 13044)
============================================================"""
    assert failures._table(table.splitlines()) == [(5, 1, -9)]
    assert failures._table(["no table here"]) == []


def test_a_worker_torchrun_stopped_is_not_the_root_cause_even_when_torchrun_names_it():
    """Both in one second: torchrun may name the worker it stopped itself (exit -15)."""
    table = """Sending process 11 closing signal SIGTERM
Failures:
[1]:
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 12)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 11)  (SIGTERM)
============================================================"""
    assert failures._table(table.splitlines()) == [(3, 1, 1)]
    alone = table.replace("exitcode  : 1 (pid: 12)", "exitcode  : -15 (pid: 11)")
    assert failures._table(alone.splitlines())[0] == (2, 0, -15)


def test_a_worker_sent_the_closing_signal_that_exited_with_its_own_code_failed_by_itself():
    """torchrun's signal reached it on its way out: its exit 1 is its own failure and is
    weighed; one that exited 143 (a trainer that catches SIGTERM) or -9 (the escalation) was
    stopped."""
    table = """Sending process 11 closing signal SIGTERM
Failures:
[1]:
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 11)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 10)
============================================================"""
    assert failures._table(table.splitlines()) == [(2, 0, 1), (3, 1, 1)]
    for code in ("143", "-15", "-9"):
        stopped = table.replace("exitcode  : 1 (pid: 11)", f"exitcode  : {code} (pid: 11)")
        assert failures._table(stopped.splitlines()) == [(2, 0, 1)], code


def test_a_failure_after_nccls_timeout_dump_says_where_the_dumps_are_and_what_reads_them(tmp_path):
    """NCCL dumps every rank's Flight Recorder on a collective timeout (the plan's
    TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_FR_DUMP_TEMP_FILE): the failure's line points at them and
    at torch's analyzer. A GPU makes them; here they are files of that name."""
    folder = tmp_path / "flight-recorder"
    prefix = str(folder / "rank_")
    assert failures.flight_dumps(prefix, 0.0) == ""  # no folder: nothing dumped
    folder.mkdir()
    old = folder / "rank_0"
    old.write_bytes(b"a dump of an earlier start")
    os.utime(old, (100.0, 100.0))
    assert failures.flight_dumps(prefix, 1000.0) == ""
    for rank in (0, 1):
        (folder / f"rank_{rank}").write_bytes(b"a dump")
    said = failures.flight_dumps(prefix, time.time() - 60)
    assert said.startswith(f"; torch's Flight Recorder dumped 2 rank(s)' collectives into {folder}")
    assert f"python -m torch.distributed.flight_recorder.fr_trace {folder} -p rank_`" in said
    assert failures.flight_dumps(None, 0.0) == ""
