"""The edge that runs the job on this node: join the other nodes, start the launcher, watch it.

`entrypoint run` stays as a small parent of the launcher (torchrun, accelerate, JAX or the
trainer itself) instead of exec'ing it, because only a process that outlives the trainer can:
- wait for node 0 in any start order and refuse a cluster whose nodes differ (preflight);
- exchange heartbeats with the other nodes' entrypoints, independent of NCCL and the trainer,
  so that a killed, paused or cut-off node stops every node within seconds, naming it;
- forward SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 to the workers within a second and kill
  them when ENTRYPOINT_GRACE_PERIOD runs out (torchrun's own deadline is a fixed 30 s);
- show the failing rank's error once, restart every node's trainer together, and exit with a
  code a platform's retry policy can use (the failing rank's own code: an exit above 128 is a
  signal only when a node received that signal);
- be a child subreaper, give the launcher a parent-death signal and keep a guard process
  beside it, so that no worker outlives it, even when it is SIGKILLed outside a container.

Signals are taken at any moment: while waiting for node 0 (the connect is interrupted), during
the join and restarts (kept, or said to node 0), and before the workers exist (passed to each
worker once it catches the signal).
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from entrypoint import control, fingerprint, logs, secrets
from entrypoint.conductor import STOPPING, Conductor, Limits
from entrypoint.errors import EXIT_CONFIG, EXIT_PEERS
from entrypoint.plan import Plan
from entrypoint.settings import Settings

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_CHILD_SUBREAPER = 36
_PEER_STOP_GRACE = 10.0  # seconds for workers to exit after another node failed
# A crash breaks its peers' collectives a moment later: node 0 waits this long for every
# node's report before it names the first failure as the cause.
_FAILURE_WINDOW = 3.0
_KEEP_LOG_RUNS = 3  # torchrun log directories kept: this start's and the two before
_TAIL_BYTES = 64 << 10  # the failure summary reads at most this much of a rank's log


class Stop(Exception):
    """End this node with `code`; `reason` is logged unless empty (node 0's conductor has
    logged the reasons it sends)."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


# -- processes ------------------------------------------------------------------------------

def become_subreaper() -> None:
    """Orphaned workers are re-parented to this process, not PID 1, so they can be found."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# The launcher is exec'd through this: it gets SIGTERM when the entrypoint dies, however it
# dies (PR_SET_PDEATHSIG survives exec). A wrapper, not preexec_fn: node 0 has threads.
_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 15, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGTERM\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(143)  # the entrypoint died before the prctl: do not start\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as err:\n"
    "    print(f'entrypoint: cannot start {sys.argv[2]}: {err.strerror}', file=sys.stderr)\n"
    "    os._exit(127)\n")

# A small process beside the entrypoint that notes its descendants every second and, when the
# entrypoint ends (its stdin reaches EOF, even after SIGKILL), sends the ones still alive
# SIGTERM, then SIGKILL after the grace period. Workers torchrun starts are in sessions of
# their own and are re-parented to init when the entrypoint dies: only a list of them, kept
# while the entrypoint lived, can find them.
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
                stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True)
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


def _children_map() -> dict[int, list[int]]:
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


def descendants(pid: int) -> list[int]:
    tree, found, todo = _children_map(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for the signal (SigCgt in /proc/PID/status): a
    Python trainer installs its SIGTERM or SIGUSR1 handler only after its imports."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _state(pid: int) -> str | None:
    """A process's state letter (R, S, Z...), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _reap(exclude: int) -> None:
    """Collect orphaned workers that ended (this process is their subreaper), never the
    launcher itself, whose exit code Popen reads."""
    for pid in _children_map().get(os.getpid(), []):
        if pid == exclude:
            continue
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                os.waitpid(pid, os.WNOHANG)
        except (OSError, ChildProcessError):
            pass


@dataclass
class Launch:
    """One start of the launcher, and how to reach its workers."""
    process: subprocess.Popen
    spawns_workers: bool  # torchrun/accelerate: the ranks are its children
    tail: collections.deque  # the launcher's last stderr lines
    started: float
    command: tuple[str, ...] = ()
    pump: threading.Thread | None = None  # passes the launcher's stderr on; ends at its EOF

    def workers(self) -> list[int]:
        if not self.spawns_workers:
            return [self.process.pid]
        return [pid for pid, parent in _parents().items() if parent == self.process.pid]

    def forward(self, sig: int) -> list[int]:
        pids = self.workers()
        _signal(pids, sig)
        return pids

    def kill_all(self) -> None:
        pids = [self.process.pid, *descendants(self.process.pid)]
        _signal(pids, signal.SIGKILL)


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it, 0-255: 128 + N when signal N ended it
    (Popen and torchrun give -N, which sys.exit would turn into 256 - N)."""
    return (128 - returncode if returncode < 0 else returncode) & 0xFF


def _prune(log_dir: Path, keep: int) -> None:
    """torchrun makes a new log directory at every start: keep the last `keep` - 1 (the new
    one makes `keep`)."""
    try:
        runs = sorted((p for p in log_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in runs[:max(0, len(runs) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def _tail(path: Path, lines: int) -> list[str]:
    """The last lines of a file, reading at most _TAIL_BYTES of it."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - _TAIL_BYTES))
        data = f.read()
    text = data.decode(errors="replace").splitlines()
    if size > _TAIL_BYTES:
        text = text[1:]  # the first line is cut
    return text[-lines:]


def _parents() -> dict[int, int]:
    return {child: parent for parent, children in _children_map().items() for child in children}


def start(plan: Plan, env: Mapping[str, str], generation: int, echo: Callable[[str], None],
          log_dir: Path | None = None) -> Launch:
    tail: collections.deque = collections.deque(maxlen=400)
    child_env = dict(env) | {"ENTRYPOINT_RESTART_COUNT": str(generation)}
    if log_dir is not None:
        _prune(log_dir, _KEEP_LOG_RUNS)
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *plan.command],
        env=child_env, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)

    def pump():
        # The launcher's stderr, passed through line by line and kept for the failure summary,
        # without torchrun's own traceback of ChildFailedError: node 0 shows the failing rank's.
        held: list[str] = []
        skipping = 0  # rulers of torchrun's failure table still to pass
        for raw in iter(process.stderr.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            tail.append(line)
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

    pumping = threading.Thread(target=pump, daemon=True, name="launcher-stderr")
    pumping.start()
    return Launch(process, plan.launcher in ("torchrun", "accelerate"), tail, time.monotonic(),
                  tuple(plan.command), pumping)


# -- what failed ----------------------------------------------------------------------------

_ROOT_RANK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_ROOT_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")
_PREFIX = re.compile(r"^\[[a-z]*\d+\]: ?")


def failure(plan: Plan, launch: Launch, code: int, log_dir: Path, lines: int = 12,
            seen: float | None = None) -> dict:
    """Rank, local rank, exit code (0-255, as the job exits), the last lines of the failing
    rank's stderr, and when it failed (its error file's last write, else `seen`: when the
    launcher's exit was seen)."""
    text = list(launch.tail)
    rank = local = exitcode = None
    if launch.spawns_workers and any("Root Cause" in line for line in text):
        block = text[max(i for i, line in enumerate(text) if "Root Cause" in line):]
        for line in block:
            if rank is None and (m := _ROOT_RANK.search(line)):
                rank, local = int(m[1]), int(m[2])
            if exitcode is None and (m := _ROOT_EXIT.search(line)):
                exitcode = int(m[1])
    elif not launch.spawns_workers:
        rank = plan.rank if plan.rank is not None else plan.node_rank
        local = plan.local_rank if plan.local_rank is not None else 0
        exitcode = code
    tail: list[str] = []
    killed = ""  # how the launcher itself died, when a signal killed it
    when = seen if seen is not None else time.time()
    read = False  # the rank's own stderr was read (empty when a signal ended it silently)
    if local is not None and launch.spawns_workers:
        runs = sorted(log_dir.glob("*/attempt_*/"), key=lambda p: p.stat().st_mtime)
        if runs:
            path = runs[-1] / str(local) / "stderr.log"
            try:
                tail = [_PREFIX.sub("", line) for line in _tail(path, lines)]  # torch's [rankN]:
                when, read = path.stat().st_mtime, True
            except OSError:
                tail = []
    if not tail and not read:  # the trainer itself, or no per-rank file: the launcher's lines
        tail = [_PREFIX.sub("", line) for line in text if "Root Cause" not in line][-lines:]
    if launch.spawns_workers and exitcode is None and code < 0:
        # The launcher itself was killed (OOM killer, a stray kill): its workers are orphans.
        command = launch.command or tuple(str(arg) for arg in launch.process.args)
        launcher = " ".join([Path(command[0]).name, *command[1:3]])
        killed = f"the launcher ({launcher}) was killed by {signal.Signals(-code).name}"
        tail, exitcode = [*tail, killed], code
    if exitcode is not None and exitcode < 0:
        sig = -exitcode
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if sig == 9 else ""
        if not killed:
            tail = tail + [f"killed by {name}{hint}"]
    return {"rank": rank, "local_rank": local,
            "exitcode": exit_status(exitcode if exitcode is not None else code), "tail": tail,
            "time": when, "killed": killed}


# -- resources for the heartbeat ------------------------------------------------------------

class Stats:
    """GPU utilization and memory (NVML) of this node's GPUs, or the CPU load."""

    def __init__(self, gpu_indices: list[int]) -> None:
        self.handles = []
        self.nvml = None
        if gpu_indices:
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = pynvml
                self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in gpu_indices]
            except Exception:  # stats are nice to have; never a reason to stop
                self.handles = []

    def read(self) -> dict:
        gpus = []
        for handle in self.handles:
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                gpus.append({"util": util, "mem_used_mib": memory.used >> 20,
                             "mem_total_mib": memory.total >> 20})
            except Exception:
                continue
        return {"gpus": gpus} if gpus else {"load": os.getloadavg()[0]}


# -- the node's life ------------------------------------------------------------------------

class _Interrupted(Exception):
    """A stopping signal while this node waits for node 0 (raised by the signal handler)."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


def _name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class Node:
    def __init__(self, plan: Plan, env: Mapping[str, str], settings: Settings, log,
                 echo: Callable[[str], None] | None = None) -> None:
        self.plan, self.env, self.settings, self.log = plan, env, settings, log
        self.secret_values = secrets.secret_values(env)
        raw_echo = echo or logs.echo
        # The trainer's stderr passes through here: a token in a traceback is masked too.
        self.echo = lambda line: raw_echo(secrets.mask(line, self.secret_values))
        self.member = plan.node_rank if plan.spawn else plan.rank
        self.expected = plan.nnodes if plan.spawn else plan.world_size
        self.unit = "node" if plan.spawn else "process"
        self.signals: collections.deque = collections.deque()
        self.server: control.Server | None = None
        self.channel: control.Channel | None = None
        self.launch: Launch | None = None
        self.guard: Guard | None = None
        self.generation = 0
        self.log_dir = Path(settings.run_dir) / f"node{plan.node_rank}" / "logs"
        # A stopping signal this node received, or that node 0 passed on: the job is ending
        # and no restart may start it again.
        self.stop_signal: int | None = None
        # Signals received while no worker existed (during the join, a restart, the launcher's
        # start): passed to the workers once they catch them.
        self.pending: list[int] = []
        self._connecting = False

    # signals arrive in the main thread; they are handled in the loop, except while this node
    # waits for node 0 (a blocking connect), which a stopping signal ends at once
    def _on_signal(self, number, _frame) -> None:
        if self._connecting and number in STOPPING:
            self._connecting = False
            raise _Interrupted(number)
        self.signals.append(number)

    def run(self) -> int:
        become_subreaper()
        for sig in FORWARDED:
            signal.signal(sig, self._on_signal)
        try:
            self._join()
            while True:
                code = self._supervise()
                if code is not None:
                    return code & 0xFF
        except Stop as stop:
            if stop.reason:
                level = "info" if stop.code == 0 else "error"
                getattr(self.log, level)(stop.reason, exit_code=stop.code)
            return stop.code & 0xFF
        except control.PeersError as err:
            self.log.error(str(err), exit_code=EXIT_PEERS)
            return EXIT_PEERS
        finally:
            self._cleanup()

    # -- join -------------------------------------------------------------------------------

    def _join(self) -> None:
        plan, s = self.plan, self.settings
        host, port = plan.master_addr, plan.control_port
        if self.member == 0:
            limits = Limits(join_timeout=s.join_timeout, heartbeat_timeout=s.heartbeat_timeout,
                            max_restarts=s.max_restarts, max_clock_skew=s.max_clock_skew,
                            monitor_interval=s.monitor_interval,
                            failure_window=_FAILURE_WINDOW if self.expected > 1 else 0.0)
            bind = "0.0.0.0" if self.expected > 1 else "127.0.0.1"
            conductor = Conductor(self.expected, limits, time.monotonic(), unit=self.unit,
                                  address=f"{host}:{port or 'auto'}")
            self.server = control.Server(conductor, port or 0, heartbeat_interval=
                                         s.heartbeat_interval, log=self._server_log, bind=bind)
            self.server.start()
            if port is None:
                host, port = "127.0.0.1", self.server.port
        waiting = "while waiting for node 0" if self.member != 0 else "before the nodes joined"
        try:
            self._connecting = True
            for sig in [x for x in self.signals if x in STOPPING][:1]:
                raise _Interrupted(sig)
            self.channel = control.connect(host, port, timeout=s.join_timeout,
                                           log=lambda line: self.log.warning(line))
        except _Interrupted as got:
            raise Stop(128 + got.sig, f"received {_name(got.sig)} {waiting}: stopping "
                                      "(nothing was started)") from None
        finally:
            self._connecting = False
        self._hello()

    def _hello(self) -> None:
        fp = fingerprint.collect(gpus_per_node=self.plan.gpus_per_node,
                                 gpu_names=self.plan.gpu_names, data_dir=self.settings.data_dir)
        fp["layout"] = (f"{self.plan.nnodes} nodes x {self.plan.nproc_per_node} workers, "
                        f"master {self.plan.master_addr}")
        self.channel.send({"t": "hello", "protocol": control.PROTOCOL, "member": self.member,
                           "node_rank": self.plan.node_rank, "host": socket.gethostname(),
                           "generation": self.generation, "time": time.time(),
                           "fingerprint": fp})
        if self.member != 0:
            self.log.info("joined node 0; waiting for every node", master=self.channel.address)
        self._await_go()

    def _await_go(self) -> None:
        deadline_silent = self.settings.heartbeat_timeout
        while True:
            if self.stop_signal is None:
                for sig in self._take_signals():
                    if sig in STOPPING:
                        self.stop_signal = sig
                        break
                    if sig not in self.pending:
                        self.pending.append(sig)
                        self.log.warning(f"received {_name(sig)} before the trainer started: "
                                         "passed to the workers once they run")
            if self.stop_signal is not None:
                sig = self.stop_signal
                # Said to node 0, so that the other nodes stop now, not at the join timeout.
                self.channel.send({"t": "exit", "code": 128 + sig, "signal": sig})
                raise Stop(128 + sig, f"received {_name(sig)} before the trainer started"
                           + (" again" if self.generation else "") + ": stopping")
            for message in self._receive(0.5):
                kind = message.get("t")
                if kind == "go":
                    for warning in message.get("warnings", []):
                        self.log.warning(warning)
                    # A node its platform started again joins the job's restart, not start 0.
                    self.generation = int(message.get("generation", self.generation))
                    return
                if kind == "stop":
                    raise Stop(int(message["code"]), self._from_node0(message["reason"]))
            self._check_master(deadline_silent)

    # -- supervise one launch ---------------------------------------------------------------

    def _supervise(self) -> int | None:
        """Start the launcher and watch it. An exit code ends the node; None: restart."""
        s = self.settings
        if self.guard is None:
            self.guard = Guard(s.grace_period)
        self.launch = start(self.plan, self.env, self.generation, self.echo, self.log_dir)
        stats = Stats(self._gpu_indices())
        last_beat = 0.0
        signalled: int | None = None
        signalled_at = 0.0
        kill_at: float | None = None
        reported = False
        code: int | None = None
        self._delivered: dict[int, set[int]] = {}  # signal: the worker pids that have it
        self._told: set[int] = set()  # non-stopping signals said to node 0 in this launch
        while True:
            now = time.monotonic()
            if now - last_beat >= s.heartbeat_interval:
                last_beat = now
                self.channel.send({"t": "beat", "stats": stats.read()})
                _reap(exclude=self.launch.process.pid)
            for sig in self._take_signals():
                if sig in STOPPING and signalled is not None:
                    self.log.warning(f"received {_name(sig)} again: already "
                                     "stopping, the workers are killed when the grace ends")
                    continue
                if sig in STOPPING:
                    self.stop_signal = sig
                    if code is not None:  # the trainer has exited: the job must not restart
                        self.log.warning(f"received {_name(sig)} after the trainer exited: "
                                         "the job stops, no restart")
                    else:
                        self._pass_on(sig, f"received {_name(sig)}")
                        signalled, signalled_at, kill_at = sig, now, now + s.grace_period
                    # Node 0 passes a stopping signal to every node's workers (one pod preempted).
                    self.channel.send({"t": "signal", "signal": sig})
                elif code is None:
                    if not self._pass_on(sig, f"received {_name(sig)}"):
                        self.pending.append(sig)  # no worker yet: for them when they start
                    else:
                        self._told.add(sig)
                        self.channel.send({"t": "signal", "signal": sig})
            if code is None:
                self._deliver_late(signalled, signalled_at, now)
            if kill_at is not None and now > kill_at and self.launch.process.poll() is None:
                self.log.error(f"workers still running {s.grace_period:g} s after the signal: "
                               "killing them")
                self.launch.kill_all()
                kill_at = None
            code = self.launch.process.poll()
            code = exit_status(code) if code is not None else None
            if code is not None and not reported:
                reported, seen = True, time.time()
                self._kill_leftovers()  # a launcher that died leaves its workers headless
                self._report_exit(code, signalled, seen)
            for message in self._receive(0.2 if code is None else 0.5):
                kind = message.get("t")
                if kind == "stop":
                    return self._stopped(message, signalled, kill_at)
                if kind == "signal" and signalled is None and code is None:
                    sig = int(message["signal"])
                    self._pass_on(sig, str(message.get("reason", "another node received it")))
                    signalled, signalled_at, kill_at = sig, now, now + s.grace_period
                    self.stop_signal = sig
                if kind == "done":
                    self._wait_launcher(5)
                    return 0 if code == 0 else (code or 0)
                if kind == "restart":
                    self._end_launch(_PEER_STOP_GRACE)
                    self.generation = int(message["generation"])
                    if self.member != 0 and self.stop_signal is None:
                        # node 0's conductor has said it already
                        self.log.warning(f"restarting the trainer ({message.get('reason', '')})",
                                         restart=self.generation)
                    self._hello()  # with a stop signal: says so to node 0 and stops
                    return None
            self._check_master(s.heartbeat_timeout)

    def _pass_on(self, sig: int, why: str) -> list[int]:
        pids = self.launch.forward(sig) if self.launch.process.poll() is None else []
        self._delivered.setdefault(sig, set()).update(pids)
        grace = (f"; they have {self.settings.grace_period:g} s (ENTRYPOINT_GRACE_PERIOD) to "
                 "checkpoint and exit" if sig in STOPPING else "")
        later = "" if pids else "; passed to the workers as they start"
        self.log.warning(f"{why}: forwarded to {len(pids)} worker process(es){grace}{later}")
        return pids

    def _deliver_late(self, signalled: int | None, signalled_at: float, now: float) -> None:
        """Workers that started after a signal arrived get it too: as soon as they catch it
        (their handler is installed), or a stopping signal once 3/4 of the grace period are
        spent even if they never do (its default action ends them)."""
        wanted = ([signalled] if signalled is not None else []) + self.pending
        if not wanted or self.launch.process.poll() is not None:
            return
        workers = self.launch.workers()
        if not workers:
            return
        patience = self.settings.grace_period * 0.75
        for sig in wanted:
            got = self._delivered.setdefault(sig, set())
            new = [pid for pid in workers if pid not in got and (
                _catches(pid, sig) or (sig == signalled and now - signalled_at > patience))]
            if not new:
                continue
            _signal(new, sig)
            got.update(new)
            self.log.warning(f"{_name(sig)} reached {len(new)} worker(s) that started after it "
                             "arrived")
            if sig != signalled and sig not in self._told:
                self._told.add(sig)
                self.channel.send({"t": "signal", "signal": sig})
        if self.pending and all(len(self._delivered.get(sig, ())) >= len(workers)
                                for sig in self.pending):
            self.pending = []

    def _report_exit(self, code: int, signalled: int | None, seen: float) -> None:
        message: dict = {"t": "exit", "code": code}
        if code != 0 and signalled is None:
            if self.launch.pump is not None:
                self.launch.pump.join(timeout=3)  # the error's last lines are in the summary
            found = failure(self.plan, self.launch, self.launch.process.returncode, self.log_dir,
                            seen=seen)
            found["tail"] = [secrets.mask(line, self.secret_values) for line in found["tail"]]
            by = found["exitcode"] - 128
            if found["exitcode"] > 128 and self._delivered.get(by):
                # Its workers had that signal from this node (SIGUSR1: checkpoint and stop).
                signalled = by
            else:
                # Whatever the code, 134, 139, 255 or 130: the trainer's own, not a signal the
                # entrypoint passed on; node 0 decides (a signal another node received makes
                # it a stop, else a failure).
                message["failure"] = found
                message["code"] = found["exitcode"]
        if signalled is not None:
            message["signal"] = signalled
        elif code != 0:
            found = message["failure"]
            first, last = self.plan.ranks
            who = f"rank {found['rank']}" if found["rank"] is not None else f"ranks {first}-{last}"
            what = found["killed"] or f"{who} failed with exit code {found['exitcode']}"
            message["reason"] = f"{self.unit} {self.member} ({socket.gethostname()}): {what}"
        self.channel.send(message)

    def _stopped(self, message: dict, signalled: int | None, kill_at: float | None) -> int:
        code, reason = int(message["code"]) & 0xFF, str(message.get("reason", ""))
        sig = message.get("signal")
        running = self.launch.process.poll() is None
        if running and signalled is not None and kill_at is not None:
            # The workers have the signal already: what is left of their grace.
            self._wait_launcher(max(0.0, kill_at - time.monotonic()))
        elif running and sig:
            # Stopped on a signal another node received: the workers checkpoint too.
            self.launch.forward(int(sig))
            self._wait_launcher(self.settings.grace_period)
        elif running:
            # Another node failed, whatever its code: SIGTERM, and the workers are killed if
            # they do not exit.
            self.launch.forward(signal.SIGTERM)
            self._wait_launcher(_PEER_STOP_GRACE)
        raise Stop(code, self._from_node0(reason))

    # -- helpers ----------------------------------------------------------------------------

    def _receive(self, timeout: float) -> list[dict]:
        messages = self.channel.receive(timeout)
        if self.channel.closed:
            if self.launch is not None and self.launch.process.poll() is None:
                self.launch.forward(signal.SIGTERM)
                self._wait_launcher(_PEER_STOP_GRACE)
            raise Stop(EXIT_PEERS, f"lost node 0 ({self.plan.master_addr}): its connection "
                                   "closed (container killed, node crashed or rebooted)")
        return messages

    def _check_master(self, timeout: float) -> None:
        silent = time.monotonic() - self.channel.last_heard
        if silent > timeout:
            if self.launch is not None and self.launch.process.poll() is None:
                self.launch.forward(signal.SIGTERM)
                self._wait_launcher(_PEER_STOP_GRACE)
            raise Stop(EXIT_PEERS, f"node 0 ({self.plan.master_addr}) silent for {silent:.0f} s "
                                   f"(ENTRYPOINT_HEARTBEAT_TIMEOUT={timeout:g}): it hangs, is "
                                   "paused or this node is cut off from it")

    def _take_signals(self) -> list[int]:
        taken = []
        while self.signals:
            taken.append(self.signals.popleft())
        return taken

    def _wait_launcher(self, seconds: float) -> None:
        if self.launch is None:
            return
        try:
            self.launch.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.launch.kill_all()
            try:
                self.launch.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def _end_launch(self, grace: float) -> None:
        if self.launch is not None and self.launch.process.poll() is None:
            self.launch.forward(signal.SIGTERM)
            self._wait_launcher(grace)
        self._kill_leftovers()  # a restart must not start beside the last launch's orphans
        if self.pending:
            self.log.warning("no worker caught " + ", ".join(_name(s) for s in self.pending)
                             + " before the trainer ended")
            self.pending = []

    def _kill_leftovers(self) -> None:
        """Kill every process still below this one: workers orphaned when their launcher died
        are re-parented here (subreaper), and none may outlive the entrypoint."""
        guard = self.guard.pid if self.guard is not None else -1
        pids = [pid for pid in descendants(os.getpid())
                if pid != guard and _state(pid) not in ("Z", None)]
        if not pids:
            return
        self.log.warning(f"killing {len(pids)} process(es) left behind by the launcher "
                         "(workers whose launcher died)", pids=pids[:20])
        _signal(pids, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_state(pid) not in ("Z", None) for pid in pids):
            time.sleep(0.05)
        _reap(exclude=self.launch.process.pid if self.launch else -1)

    def _from_node0(self, reason: str) -> str:
        return f"stopped by node 0: {reason}" if self.member != 0 else ""

    def _server_log(self, level: str, text: str) -> None:
        # From the control server's thread: through the log writer's queue, never blocking.
        if text.startswith("worker failed"):  # the failure summary, once, at node 0
            head, *lines = text.split("\n")
            self.log.error(head, traceback=[line.removeprefix("    ") for line in lines])
            return
        getattr(self.log, level)(text)

    def _gpu_indices(self) -> list[int]:
        if not self.plan.cuda_visible_devices:
            return []
        return [int(x) for x in self.plan.cuda_visible_devices.split(",") if x.isdigit()]

    def _cleanup(self) -> None:
        if self.launch is not None:
            self._kill_leftovers()
        if self.channel is not None:
            self.channel.close()
        if self.server is not None:
            self.server.finished.wait(timeout=12)
            self.server.stop()
        if self.guard is not None:
            self.guard.close()


def run(plan: Plan, env: Mapping[str, str], settings: Settings, log) -> int:
    code = Node(plan, env, settings, log).run()
    return code if code is not None else EXIT_CONFIG
