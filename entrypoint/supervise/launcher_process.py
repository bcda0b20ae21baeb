"""One start of the launcher: its process, its workers, and its stderr passed on; under torchrun,
each worker's stdout and stderr too, from the files torchrun writes them to, whole lines only."""

from __future__ import annotations

import collections
import io
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from entrypoint.plan.node_plan import Plan
from entrypoint.supervise import procs
from entrypoint.trainer_side.inner_launcher import NODE_PID

_TAIL_LINES = 400  # the launcher's stderr lines kept for the failure summary
MAX_RELAY_LINE = 64 << 10  # bytes of one stderr line passed on; the rest is dropped, counted
_END = re.compile(rb"\r\n?|\n")  # a line ends at \n, \r\n, or a lone \r (a progress bar)


@dataclass
class LauncherProcess:
    """One start of the launcher, and how to reach its workers."""

    process: subprocess.Popen
    spawns_workers: bool  # torchrun/accelerate: the ranks are its children
    tail: collections.deque  # the launcher's last stderr lines
    started: float
    command: tuple[str, ...] = ()
    pump: threading.Thread | None = None  # passes the launcher's stderr on; ends at its EOF
    # When the launcher ended (time.time()), noted by a thread that waits for it: a node that
    # sees the exit a turn later still reports the launcher's own time, which node 0 compares
    # with other nodes' failures to name the first (a killed torchrun against the ranks on
    # other nodes that failed because of it).
    ended_at: float | None = None

    def running(self) -> bool:
        return self.process.poll() is None

    def workers(self) -> list[int]:
        if not self.spawns_workers:
            return [self.process.pid]
        return procs.children(self.process.pid)

    def forward(self, sig: int) -> list[int]:
        pids = self.workers()
        procs.send(pids, sig)
        return pids

    def kill_all(self) -> None:
        procs.kill_tree(self.process.pid)

    def stop(self, grace: float, sig: int | None = None) -> None:
        """`sig` to the workers (when given), up to `grace` to exit, then SIGKILL."""
        procs.stop_then_kill(self.process, grace, sig, self.workers)


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it, 0-255: 128 + N when signal N ended it
    (Popen and torchrun give -N, which sys.exit would turn into 256 - N)."""
    return (128 - returncode if returncode < 0 else returncode) & 0xFF


def relay(lines: Iterable[str], echo: Callable[[str], None]) -> None:
    """Pass the launcher's stderr lines on, without torchrun's own traceback of
    ChildFailedError and its failure table: node 0 shows the failing rank's."""
    held: list[str] = []
    skipping = 0  # rulers of torchrun's failure table still to pass
    for line in lines:
        if skipping:
            skipping -= line.startswith("=====")
            continue
        if held or line == "Traceback (most recent call last):":
            held.append(line)
            if "ChildFailedError" in line:
                held, skipping = [], 2
            elif len(held) > 200 or not line.startswith((" ", "Traceback")):
                for kept in held:
                    echo(kept)
                held = []
            continue
        echo(line)
    for kept in held:
        echo(kept)


def _lines(stream: IO[bytes], limit: int = MAX_RELAY_LINE) -> Iterator[str]:
    """The stream's lines, decoded: each cut to `limit` bytes (a marker says how many more
    were dropped), so that a trainer writing without newlines cannot grow this process; `\\r`
    ends a line too, so that each state of a progress bar is a line of its own."""
    pending, dropped, after_cr = bytearray(), 0, False

    def line() -> str:
        text = pending.decode(errors="replace")
        if dropped:
            text += f" [entrypoint: {dropped:,} more bytes of this line dropped]"
        return text

    # read1: what the pipe has now, not a full buffer (a progress bar shows as it goes).
    read = stream.read1 if isinstance(stream, io.BufferedIOBase) else stream.read
    while chunk := read(1 << 16):
        start = 1 if after_cr and chunk[:1] == b"\n" else 0  # \r\n split between two reads
        for end in _END.finditer(chunk, start):
            piece = chunk[start : end.start()]
            room = limit - len(pending)
            pending += piece[:room]
            dropped += max(0, len(piece) - room)
            yield line()
            pending, dropped = bytearray(), 0
            start = end.end()
        after_cr = chunk.endswith(b"\r")
        piece = chunk[start:]
        room = max(0, limit - len(pending))
        pending += piece[:room]
        dropped += len(piece) - len(piece[:room])
    if pending or dropped:
        yield line()


def _kept_lines(stream: IO[bytes], tail: collections.deque) -> Iterable[str]:
    """The stream's lines (`_lines`), each also kept in `tail` for the failure summary."""
    for line in _lines(stream):
        tail.append(line)
        yield line


class WorkerOutput(threading.Thread):
    """The workers' stdout and stderr of one torchrun start (`--redirects=3`: each worker's in
    files of its own), passed on a whole line at a time: stdout as the worker printed it, stderr
    prefixed `[default<local rank>]:`, as torchrun's `--tee=2` left them. torchrun's tee
    writes what it has read, a partial line included, and workers writing to one stdout mix
    mid-line (`[Gloo] Rank [Gloo] Rank 2 is connected`); here a line waits for its end, or
    HOLD seconds. Ends once the launcher
    has exited and its files are read to the end."""

    HOLD = 1.0  # seconds a line without its end waits before it is passed on as it is
    POLL = 0.1

    def __init__(
        self,
        log_dir: Path,
        process: subprocess.Popen,
        echo: Callable[[str], None],
        out: Callable[[str], None],
    ):
        """`echo`: where a worker's stderr lines go (the node's stderr); `out`: its stdout's."""
        super().__init__(name="worker-output", daemon=True)
        self.log_dir, self.process, self.echo, self.out = log_dir, process, echo, out
        self.before = set(log_dir.glob("*/")) if log_dir.is_dir() else set()  # earlier starts
        self.files: dict[Path, list] = {}  # path: [offset, pending bytes, pending since, prefix]

    def run(self) -> None:
        while self.process.poll() is None:
            self._scan()
            self._pump(time.monotonic(), final=False)
            time.sleep(self.POLL)
        self._scan()
        self._pump(time.monotonic(), final=True)

    def _scan(self) -> None:
        for run in self.log_dir.glob("*/"):
            if run in self.before:
                continue
            for path in run.glob("attempt_*/*/std*.log"):
                if path not in self.files and path.parent.name.isdigit():
                    self.files[path] = [0, b"", 0.0, f"[default{path.parent.name}]:"]

    def _pump(self, now: float, final: bool) -> None:
        for path, state in sorted(self.files.items()):
            offset, pending, since, prefix = state
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read(1 << 20)
            except OSError:
                continue
            if chunk:
                since = since if pending else now
                pending += chunk
                offset += len(chunk)
            # stdout as the worker printed it, stderr prefixed: as torchrun's own --tee=2 did
            say = self.out if path.name == "stdout.log" else self.echo
            prefix = "" if path.name == "stdout.log" else prefix
            *lines, pending = _END.split(pending)
            for line in lines:
                if line:
                    say(prefix + line[:MAX_RELAY_LINE].decode(errors="replace"))
            if pending and (final or now - since >= self.HOLD or len(pending) > MAX_RELAY_LINE):
                say(prefix + pending[:MAX_RELAY_LINE].decode(errors="replace"))
                pending = b""
            self.files[path] = [offset, pending, since if pending else 0.0, prefix]


def _log_dir(command: Iterable[str]) -> Path | None:
    """torchrun's --log-dir in the launcher's command, when it writes each worker's output there
    (--redirects=3 without --tee: the entrypoint passes it on, WorkerOutput)."""
    args = list(command)
    if "--redirects=3" not in args or any(a.startswith("--tee") for a in args):
        return None
    found = next((a.split("=", 1)[1] for a in args if a.startswith("--log-dir=")), None)
    return Path(found) if found else None


def _print(line: str) -> None:
    print(line, flush=True)


def start(
    plan: Plan,
    env: Mapping[str, str],
    generation: int,
    echo: Callable[[str], None],
    out: Callable[[str], None] = _print,
) -> LauncherProcess:
    """Start the plan's launcher, its stderr relayed to `echo` by a thread of its own (and under
    torchrun, the workers' output by another, WorkerOutput)."""
    tail: collections.deque = collections.deque(maxlen=_TAIL_LINES)
    log_dir = _log_dir(plan.command)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    # the node's pid: its own launcher is its child (trainer_side/inner_launcher.py)
    child_env = dict(env) | {
        "ENTRYPOINT_RESTART_COUNT": str(generation),
        NODE_PID: str(os.getpid()),
    }
    process = subprocess.Popen(
        procs.dying_with_this(plan.command),
        env=child_env,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    stderr = process.stderr
    assert stderr is not None  # stderr=PIPE
    pumping = threading.Thread(
        target=relay, args=(_kept_lines(stderr, tail), echo), daemon=True, name="launcher-stderr"
    )
    pumping.start()
    if log_dir is not None:
        WorkerOutput(log_dir, process, echo, out).start()
    launch = LauncherProcess(
        process,
        plan.launcher in ("torchrun", "accelerate"),
        tail,
        time.monotonic(),
        tuple(plan.command),
        pumping,
    )
    threading.Thread(target=_note_end, args=(launch,), daemon=True, name="launcher-end").start()
    return launch


def _note_end(launch: LauncherProcess) -> None:
    """Wait for the launcher to end without collecting it (WNOWAIT: Popen reads its code),
    and note when."""
    try:
        os.waitid(os.P_PID, launch.process.pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # Popen collected it first: it has just ended
        pass
    launch.ended_at = time.time()
