"""What failed: the failing rank, its exit code and last lines, from torchrun's output and logs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from entrypoint.control.messages import Exit
from entrypoint.control.rank_records import Failure
from entrypoint.plan.network import FLIGHT_RECORDER_OLD_NAMES
from entrypoint.plan.node_plan import Plan
from entrypoint.supervise.launcher_process import LauncherProcess, exit_status

KEEP_LOG_RUNS = 3  # torchrun log directories kept: this start's and the two before
TAIL_BYTES = 64 << 10  # the failure summary reads at most this much of a rank's log

_ROOT_RANK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_ROOT_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
_CLOSING = re.compile(r"Sending process (\d+) closing signal (SIG[A-Z]+)")
_PREFIX = re.compile(r"^\[[a-z]*\d+\]: ?")
# What a rank writes when it only lost a peer, the error being another rank's: gloo's and the
# c10d store's "Connection closed/reset by peer", a broken pipe, NCCL's remote error or abort,
# JAX's coordination service ("another task died").
_LOST_A_PEER = re.compile(
    r"connection (?:closed|reset)|broken pipe|remote process exited|ncclRemoteError"
    r"|communicator was aborted|another task died",
    re.IGNORECASE,
)
PEER_LINES = 40  # the last lines of a rank's stderr read for that


def lost_a_peer(lines: list[str]) -> bool:
    """Whether a rank's last lines say it failed because a peer was lost."""
    return any(_LOST_A_PEER.search(line) for line in lines)


def prune(log_dir: Path, keep: int) -> None:
    """torchrun makes a new log directory at every start: keep the last `keep` - 1 (the new
    one makes `keep`)."""
    try:
        runs = sorted((p for p in log_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in runs[: max(0, len(runs) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def tail(path: Path, lines: int) -> list[str]:
    """The last lines of a file, reading at most TAIL_BYTES of it."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - TAIL_BYTES))
        data = f.read()
    text = data.decode(errors="replace").splitlines()
    if size > TAIL_BYTES:
        text = text[1:]  # the first line is cut
    return text[-lines:]


def _table(text: list[str]) -> list[tuple[int, int, int | None]]:
    """Every failure in torchrun's last failure table (its "Failures:" and "Root Cause"
    sections), the root cause first, but for the workers torchrun itself stopped (the
    "closing signal" it sent once one failed) while others failed: rank, local rank and exit
    code. A worker sent that signal counts as stopped by it only when it ended by it (or by
    SIGKILL, torchrun's escalation), or exited 128 + its number as a trainer that catches it
    does: one that exited with a code of its own failed by itself, the signal having reached it
    on its way out (under load, the crash can exit after the peer it broke)."""
    failed, _stopped = _failures(text)
    return failed


def _failures(
    text: list[str],
) -> tuple[list[tuple[int, int, int | None]], list[tuple[int, int, int | None]]]:
    """torchrun's last failure table as (the failures `_table` weighs, the workers it stopped)."""
    starts = [i for i, line in enumerate(text) if "Root Cause" in line]
    if not starts:
        return [], []
    root = starts[-1]
    heads = [i for i, line in enumerate(text[:root]) if line.strip().endswith("Failures:")]
    sent = {int(m[1]): m[2] for line in text[:root] if (m := _CLOSING.search(line))}
    found: list[list] = []
    for line in text[root:] + text[heads[-1] if heads else root : root]:
        if m := _ROOT_RANK.search(line):
            found.append([int(m[1]), int(m[2]), None, None])
        elif found and found[-1][2] is None and (m := _ROOT_EXIT.search(line)):
            found[-1][2:] = [int(m[1]), int(m[2]) if m[2] else None]
    stopped = {pid for _, _, code, pid in found if pid in sent and _ended_by(code, sent[pid])}
    failed = [(rank, local, code) for rank, local, code, pid in found if pid not in stopped]
    if not failed:
        return [(rank, local, code) for rank, local, code, _ in found[:1]], []
    return failed, [(rank, local, code) for rank, local, code, pid in found if pid in stopped]


def _ended_by(code: int | None, name: str) -> bool:
    """Whether exit code `code` (torchrun's: -N for death by signal N) is signal `name`'s doing:
    death by it or by SIGKILL, or 128 + its number."""
    number = getattr(signal, name, None)
    signals = {signal.SIGKILL} | ({number} if number is not None else set())
    return code is not None and any(code in (-s, 128 + s) for s in signals)


def _root_cause(
    plan: Plan, launch: LauncherProcess, text: list[str], code: int, log_dir: Path
) -> tuple[int | None, int | None, int | None]:
    """Rank, local rank and exit code: from torchrun's failure table, or the trainer's.

    torchrun names as root cause the failure with the smallest timestamp, in whole seconds:
    when a rank raises and its peer on the same node fails a moment later because of it
    (gloo's "Connection closed by peer"), both are seen in one poll and the lower rank is
    named. Where the table lists several that torchrun did not stop itself, a rank whose own
    last lines say it lost a peer comes after one whose do not (the crash's exit-time writes
    can land after its peer's error, under load), then the one whose stderr was last written
    first: the peer's own error comes after the first's. Where every one of them only lost a
    peer, a worker torchrun stopped whose stderr ends in an error of its own is the crash (under
    load, its peer exited first and torchrun's closing signal ended the crash before it did):
    it is named, with the launch's exit code."""
    if not launch.spawns_workers:
        rank = plan.rank if plan.rank is not None else plan.node_rank
        local = plan.local_rank if plan.local_rank is not None else 0
        return rank, local, code
    table, stopped = _failures(text)
    if not table:
        return None, None, None
    run = _newest_run(log_dir) if len(table) > 1 or stopped else None
    seen = {local: _heard(run, local) for _, local, _ in table} if run else {}
    heard = {local: found for local, found in seen.items() if found is not None}
    if run is not None and heard and all(lost for lost, _ in heard.values()):
        crash = next((w for w in stopped if _own_error(run, w[1])), None)
        if crash is not None:  # the crash itself, stopped by torchrun before it exited
            return crash[0], crash[1], table[0][2]
    if len(table) > 1 and heard and len(heard) == len(seen):
        return min(table, key=lambda failed: heard[failed[1]])  # stable: root on ties
    return table[0]


def _newest_run(log_dir: Path) -> Path | None:
    runs = sorted(log_dir.glob("*/attempt_*/"), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def _heard(run: Path, local: int) -> tuple[bool, float] | None:
    """Whether a local rank's stderr in torchrun's log directory `run` says it lost a peer,
    and when it was last written; None when there is no such file."""
    path = run / str(local) / "stderr.log"
    try:
        return lost_a_peer(tail(path, PEER_LINES)), path.stat().st_mtime
    except OSError:
        return None


def _own_error(run: Path, local: int) -> bool:
    """Whether a local rank's stderr ends in an error of its own (a traceback that does not say
    it lost a peer)."""
    try:
        lines = tail(run / str(local) / "stderr.log", PEER_LINES)
    except OSError:
        return False
    return any("Traceback (most recent call last)" in line for line in lines) and not lost_a_peer(
        lines
    )


def _rank_log(log_dir: Path, local: int, lines: int) -> tuple[list[str], float] | None:
    """The last lines of a local rank's stderr in torchrun's newest log directory, and when
    it was last written; None when there is no such file."""
    run = _newest_run(log_dir)
    if run is None:
        return None
    path = run / str(local) / "stderr.log"
    try:
        found = [_PREFIX.sub("", line) for line in tail(path, lines)]  # torch's [rankN]:
        return found, path.stat().st_mtime
    except OSError:
        return None


def _launcher_killed(launch: LauncherProcess, code: int) -> str:
    """The launcher itself was killed (OOM killer, a stray kill): its workers are orphans."""
    args = launch.process.args  # a list: start() passes one
    command = launch.command or tuple(str(arg) for arg in args)  # type: ignore[union-attr]
    launcher = " ".join([Path(command[0]).name, *command[1:3]])
    return f"the launcher ({launcher}) was killed by {signal.Signals(-code).name}"


def failure(
    plan: Plan,
    launch: LauncherProcess,
    code: int,
    log_dir: Path,
    lines: int = 12,
    seen: float | None = None,
) -> Failure:
    """Rank, local rank, exit code (0-255, as the job exits), the last lines of the failing
    rank's stderr, and when it failed (its error file's last write, else `seen`: when the
    launcher's exit was seen)."""
    text = list(launch.tail)
    rank, local, exitcode = _root_cause(plan, launch, text, code, log_dir)
    lines_found: list[str] = []
    killed = ""  # how the launcher itself died, when a signal killed it
    when = seen if seen is not None else time.time()
    read = False  # the rank's own stderr was read (empty when a signal ended it silently)
    if local is not None and launch.spawns_workers:
        found = _rank_log(log_dir, local, lines)
        if found is not None:
            (lines_found, when), read = found, True
    if not lines_found and not read:  # the trainer itself, or no per-rank file: the launcher's
        lines_found = [_PREFIX.sub("", line) for line in text if "Root Cause" not in line][-lines:]
    if launch.spawns_workers and exitcode is None and code < 0:
        killed = _launcher_killed(launch, code)
        lines_found, exitcode = [*lines_found, killed], code
    if exitcode is not None and exitcode < 0:
        sig = -exitcode
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if sig == 9 else ""
        if not killed:
            lines_found = lines_found + [f"killed by {name}{hint}"]
    return Failure(
        rank=rank,
        local_rank=local,
        exitcode=exit_status(exitcode if exitcode is not None else code),
        tail=tuple(lines_found),
        time=when,
        killed=killed,
        peer_lost=lost_a_peer(lines_found),
    )


def exit_report(
    plan: Plan,
    launch: LauncherProcess,
    code: int,
    signalled: int | None,
    *,
    delivered: Mapping[int, set[int]],
    log_dir: Path,
    seen: float,
    who: str,
    mask: Callable[[str], str],
) -> Exit:
    """The exit message to node 0 for a launch that ended with `code` (0-255): a signal's
    stop, or a failure with its summary (rank, exit code, masked last lines) and reason."""
    found: Failure | None = None
    if code != 0 and signalled is None:
        if launch.pump is not None:
            launch.pump.join(timeout=3)  # the error's last lines are in the summary
        seen_failure = failure(plan, launch, launch.process.returncode, log_dir, seen=seen)
        seen_failure = replace(seen_failure, tail=tuple(mask(line) for line in seen_failure.tail))
        exitcode = seen_failure.exitcode if seen_failure.exitcode is not None else code
        by = exitcode - 128
        if exitcode > 128 and delivered.get(by):
            # Its workers had that signal from this node (SIGUSR1: checkpoint and stop).
            signalled = by
        else:
            # Whatever the code, 134, 139, 255 or 130: the trainer's own, not a signal the
            # entrypoint passed on; node 0 decides (a signal another node received makes
            # it a stop, else a failure).
            found = seen_failure
            code = exit_status(exitcode)  # -9 from torchrun: 137
    if signalled is not None:
        return Exit(code, signal=signalled, failure=found)
    if code == 0 or found is None:
        return Exit(code)
    first, last = plan.ranks
    ranks = f"rank {found.rank}" if found.rank is not None else f"ranks {first}-{last}"
    what = found.killed or f"{ranks} failed with exit code {found.exitcode}"
    since = time.time() - (time.monotonic() - launch.started)
    # the plan's, or yours under either name (kept, so not in the plan)
    names = ("TORCH_FR_DUMP_TEMP_FILE", *FLIGHT_RECORDER_OLD_NAMES["TORCH_FR_DUMP_TEMP_FILE"])
    prefix = next((v for n in names if (v := plan.env.get(n) or os.environ.get(n))), None)
    what += flight_dumps(prefix, since)
    return Exit(code, failure=found, reason=f"{who}: {what}")


def flight_dumps(prefix: str | None, since: float) -> str:
    """Where torch's Flight Recorder dumped this launch's records (NCCL dumps every rank's on a
    collective timeout, TORCH_NCCL_DUMP_ON_TIMEOUT), and the analyzer that reads them; "" when
    nothing was dumped since `since` (wall clock)."""
    if not prefix:
        return ""
    folder, name = Path(prefix).parent, Path(prefix).name
    try:
        dumps = [p for p in folder.glob(f"{name}*") if p.stat().st_mtime >= since]
    except OSError:
        return ""
    if not dumps:
        return ""
    return (
        f"; torch's Flight Recorder dumped {len(dumps)} rank(s)' collectives into {folder} "
        f"(a collective timed out): `python -m torch.distributed.flight_recorder.fr_trace "
        f"{folder} -p {name}` names the collective each rank reached"
    )
