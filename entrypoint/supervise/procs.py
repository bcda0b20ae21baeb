"""This node's process tree: the subreaper, /proc reads, signalling, reaping, the Guard."""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from entrypoint.supervise.logs import Logger

_PR_SET_CHILD_SUBREAPER = 36
KILL_WAIT = 10.0  # seconds to wait for a process after its SIGKILL
LEFTOVER_WAIT = 5.0  # seconds for leftover processes to be gone after their SIGKILL

# A child (the launcher, an etcd member) is exec'd through this: it gets SIGTERM when the
# entrypoint dies, however it dies (PR_SET_PDEATHSIG survives exec). A wrapper, not
# preexec_fn: node 0 has threads.
_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 15, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGTERM\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(143)  # the entrypoint died before the prctl: do not start\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as err:\n"
    "    print(f'entrypoint: cannot start {sys.argv[2]}: {err.strerror}', file=sys.stderr)\n"
    "    os._exit(127)\n"
)


def dying_with_this(argv: Iterable[str]) -> list[str]:
    """`argv` run so that it gets SIGTERM when this process dies (_DIE_WITH_PARENT)."""
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


def become_subreaper() -> None:
    """Orphaned workers are re-parented to this process, not PID 1, so they can be found."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# A small process beside the entrypoint that notes its descendants every second and, when the
# entrypoint ends (its stdin reaches EOF, even after SIGKILL), sends the ones still alive
# SIGTERM, then SIGKILL after the grace period. Workers torchrun starts are in sessions of
# their own and are re-parented to init when the entrypoint dies: only a list of them, kept
# while the entrypoint lived, can find them. A script of its own (`-I -S`), so it cannot
# share stop_then_kill below.
_GUARD = """
import os, select, signal, sys, time
root, grace, me = int(sys.argv[1]), float(sys.argv[2]), os.getpid()
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, signal.SIG_IGN)
watched = {}
def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
def snapshot():
    tree = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat(entry)) and fields[0] != "Z":
            tree.setdefault(int(fields[1]), []).append((int(entry), fields[19]))
    todo = [root]
    while todo:
        for pid, started in tree.get(todo.pop(), []):
            if pid != me:
                watched[pid] = started
                todo.append(pid)
def alive():
    return [p for p, s in watched.items() if (f := stat(p)) and f[0] != "Z" and f[19] == s]
while True:
    snapshot()
    ready, _, _ = select.select([0], [], [], 1.0)
    if ready and not os.read(0, 4096):
        break
for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
    for pid in alive():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    end = time.monotonic() + wait
    while alive() and time.monotonic() < end:
        time.sleep(0.1)
"""


class Guard:
    """Kills what is left of this node's processes when the entrypoint ends, however it ends
    (see _GUARD). Closing its pipe, or this process's death, sets it off."""

    def __init__(self, grace: float) -> None:
        read, write = os.pipe()
        self._write: int | None = write
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _GUARD, str(os.getpid()), str(grace)],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(read)
        os.set_inheritable(write, False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        if self._write is not None:
            os.close(self._write)
            self._write = None


def children_map() -> dict[int, list[int]]:
    """Every process's children, by parent pid, from /proc."""
    tree: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree[ppid].append(int(entry))
    return tree


def children(pid: int) -> list[int]:
    """The direct children of a process."""
    return list(children_map().get(pid, []))


def descendants(pid: int) -> list[int]:
    tree, found, todo = children_map(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def send(pids: Iterable[int], sig: int) -> None:
    """Send a signal to each process, passing over those already gone."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for the signal (SigCgt in /proc/PID/status): a
    Python trainer installs its SIGTERM or SIGUSR1 handler only after its imports."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def state(pid: int) -> str | None:
    """A process's state letter (R, S, Z...), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Running or stopped: neither gone nor a zombie."""
    return state(pid) not in ("Z", None)


def reap(exclude: int) -> None:
    """Collect orphaned workers that ended (this process is their subreaper), never the
    launcher itself, whose exit code Popen reads."""
    for pid in children_map().get(os.getpid(), []):
        if pid == exclude:
            continue
        try:
            if state(pid) == "Z":
                os.waitpid(pid, os.WNOHANG)
        except (OSError, ChildProcessError):
            pass


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process below it."""
    send([pid, *descendants(pid)], signal.SIGKILL)


def kill_and_wait(pids: list[int], seconds: float) -> None:
    """SIGKILL the processes, then wait up to `seconds` for them to be gone."""
    send(pids, signal.SIGKILL)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)


def stop_then_kill(
    process: subprocess.Popen,
    grace: float,
    sig: int | None = None,
    targets: Callable[[], list[int]] | None = None,
) -> None:
    """Send `sig` (when given) to `targets()` while the process runs, wait up to `grace` for it
    to exit, then SIGKILL it and everything below it and wait up to KILL_WAIT more."""
    if sig is not None and process.poll() is None:
        send(targets() if targets is not None else [process.pid], sig)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        try:
            process.wait(timeout=KILL_WAIT)
        except subprocess.TimeoutExpired:
            pass


def kill_leftovers(
    log: Logger,
    guard: int,
    launcher: int,
    seconds: float = LEFTOVER_WAIT,
    keep: Iterable[int] = (),
) -> None:
    """Kill every process still below this one but the guard (and `keep`: this node's etcd
    member, with the processes below it): workers orphaned when their launcher died are
    re-parented here (subreaper), and none may outlive the entrypoint."""
    spared = {guard, *keep}
    for pid in list(spared):
        spared.update(descendants(pid))
    pids = [pid for pid in descendants(os.getpid()) if pid not in spared and alive(pid)]
    if not pids:
        return
    log.warning(
        f"killing {len(pids)} process(es) left behind by the launcher "
        "(workers whose launcher died)",
        pids=pids[:20],
    )
    kill_and_wait(pids, seconds)
    reap(exclude=launcher)
