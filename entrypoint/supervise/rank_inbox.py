"""This node's end of its ranks' progress reports (entrypoint.trainer_side.step_hook): a Unix
datagram socket in the abstract namespace that the ranks report to, read by a thread of its own
(a datagram socket queues only net.unix.max_dgram_qlen datagrams, 10 by default: the
supervising loop's turns are too far apart); what the heartbeat carries to node 0; and the ranks'
stacks, dumped on node 0's request into the log directory and read back."""

from __future__ import annotations

import json
import linecache
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from entrypoint.control.message_fields import (
    COLLECTIVE_FIELDS,
    COLLECTIVE_TEXT,
    MAX_FRAMES,
    MAX_GROUPS,
    MAX_TIMEOUT,
    BadMessage,
    check_collectives,
)
from entrypoint.control.rank_records import Collective, Frame, RankDump, RankReport
from entrypoint.trainer_side import flight
from entrypoint.trainer_side.step_hook import (
    DUMP_SIGNAL,
    SOCKET_VARIABLE,
    STACKS_VARIABLE,
    VERSION,
    WIRE,
)

DUMP_WAIT = 1.0  # seconds the ranks get to write their stacks
# seconds a rank's own thread gets to write its stacks before faulthandler's signal is sent to
# it (a rank stuck in C code that holds the GIL: its thread cannot run)
SIGNAL_AFTER = 0.5


@dataclass
class Rank:
    rank: int
    local_rank: int
    pid: int
    steps: int = 0
    last_step: float = 0.0  # CLOCK_MONOTONIC, shared with the ranks
    lead_sum: float = 0.0  # since the last beat
    leads: int = 0
    longest: float = 0.0
    saving: bool = False
    active: float = 0.0  # CLOCK_MONOTONIC of its last forward pass in evaluation (0: none)
    timeout: float = 0.0  # its default process group's collective timeout, seconds (0: unknown)


class Inbox:
    """The socket this node's ranks report to, and what they reported."""

    def __init__(self, stacks_dir: Path) -> None:
        self.name = f"entrypoint-progress-{os.getpid()}-{secrets.token_hex(6)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind("\0" + self.name)
        self.sock.settimeout(0.5)
        self.stacks_dir = stacks_dir
        self.ranks: dict[int, Rank] = {}
        self.dumped_at: float | None = None
        self.asked: dict[int, tuple[int, int]] = {}  # pid: (rank, its stack file's size then)
        self.lock = threading.Lock()
        self.closed = False
        self.reader = threading.Thread(target=self._read, name="rank-progress", daemon=True)
        self.reader.start()

    def env(self) -> dict[str, str]:
        """What the trainer's processes need to report here."""
        return {SOCKET_VARIABLE: "@" + self.name, STACKS_VARIABLE: str(self.stacks_dir)}

    def new_launch(self) -> None:
        with self.lock:
            self.ranks.clear()
        self.dumped_at = None

    def _read(self) -> None:
        while not self.closed:
            try:
                data = self.sock.recv(256)
            except (TimeoutError, InterruptedError):
                continue
            except OSError:
                return
            if len(data) == WIRE.size:
                self._take(WIRE.unpack(data))

    def _take(self, fields: tuple) -> None:
        version, rank, local, pid, steps, last, lead_sum, leads, longest, saving, *rest = fields
        active, timeout = rest
        if version != VERSION:
            return
        with self.lock:
            r = self.ranks.get(rank)
            if r is None or r.pid != pid:
                r = self.ranks[rank] = Rank(rank, local, pid)
            r.steps, r.last_step, r.saving, r.active = steps, last, bool(saving), active
            r.timeout = timeout
            r.lead_sum += lead_sum
            r.leads += leads
            r.longest = max(r.longest, longest)

    def reports(self, now: float | None = None) -> list[RankReport]:
        """Each living rank's progress for the heartbeat; the per-beat sums start again."""
        now = time.monotonic() if now is None else now
        out = []
        with self.lock:
            gone = [rank for rank, r in self.ranks.items() if not _alive(r.pid)]
            for rank in gone:
                del self.ranks[rank]
            for rank in sorted(self.ranks):
                r = self.ranks[rank]
                lead = round(r.lead_sum / r.leads, 5) if r.leads else None
                age = max(0.0, now - r.last_step) if r.steps else 0.0
                evaluated = max(0.0, now - r.active) if r.steps and r.active else None
                timeout = r.timeout if 0 < r.timeout <= MAX_TIMEOUT else None  # NaN too
                report = RankReport(
                    rank, r.steps, age, lead, r.longest, r.saving, evaluated, timeout
                )
                out.append(report)
                r.lead_sum, r.leads, r.longest = 0.0, 0, 0.0
        return out

    def dump(self, now: float) -> None:
        """Ask every rank for its stacks and its process groups' last collectives (torch's
        Flight Recorder): its own thread writes both, in turn (entrypoint.trainer_side.flight).
        A rank with no such thread (none answers on its socket) gets faulthandler's signal for
        its stacks (registered by the site hook), and so does one whose thread has not written
        them within SIGNAL_AFTER (`dump_ready`)."""
        with self.lock:
            ranks = list(self.ranks.values())
        self.asked = {}
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as ask:
            ask.setblocking(False)
            for r in ranks:
                self._collectives_file(r.rank, r.pid).unlink(missing_ok=True)  # no stale answer
                size = self._stack_size(r.rank, r.pid)
                try:
                    ask.sendto(b"dump", flight.address("\0" + self.name, r.pid))
                    self.asked[r.pid] = (r.rank, size)
                except OSError:  # refused where no recorder's thread answers
                    _signal(r.pid)
        self.dumped_at = now

    def _stack_size(self, rank: int, pid: int) -> int:
        try:
            return (self.stacks_dir / f"rank{rank}.pid{pid}.txt").stat().st_size
        except OSError:
            return -1

    def _collectives_file(self, rank: int, pid: int) -> Path:
        return self.stacks_dir / f"rank{rank}.pid{pid}.collectives.json"

    def dump_ready(self, now: float) -> bool:
        """Whether the ranks' answers can be read; on the way, the signal to each rank whose
        thread wrote no stacks within SIGNAL_AFTER."""
        if self.dumped_at is None:
            return False
        if self.asked and now - self.dumped_at >= SIGNAL_AFTER:
            for pid, (rank, size) in self.asked.items():
                if self._stack_size(rank, pid) <= size:
                    _signal(pid)
            self.asked = {}
        return now - self.dumped_at >= DUMP_WAIT

    def stacks(self) -> list[RankDump]:
        """Each rank's main-thread stack from its last dump, innermost frame first."""
        self.dumped_at = None
        out = []
        with self.lock:
            ranks = dict(self.ranks)
        for rank in sorted(ranks):
            r = ranks[rank]
            path = self.stacks_dir / f"rank{rank}.pid{r.pid}.txt"
            try:
                text = path.read_text(errors="replace")[-(1 << 20) :]
            except OSError:
                text = ""
            frames = tuple(Frame(*f) for f in main_stack(text)[:MAX_FRAMES])
            collectives = self._collectives(rank, r.pid) or []
            out.append(RankDump(rank, r.steps, frames, tuple(Collective(*c) for c in collectives)))
        return out

    def _collectives(self, rank: int, pid: int) -> list | None:
        """The rank's answer from its Flight Recorder, its texts and groups cut to what node 0
        takes; None without one, or with one that node 0 would not take."""
        try:
            answer = json.loads(self._collectives_file(rank, pid).read_text()[: 1 << 16])
            fitted = [
                [
                    v[: COLLECTIVE_TEXT[k]] if k in COLLECTIVE_TEXT and type(v) is str else v
                    for k, v in zip(COLLECTIVE_FIELDS, c, strict=True)
                ]
                for c in answer[:MAX_GROUPS]
            ]
            check_collectives(fitted)  # node 0 would refuse the whole node's answer
        except (OSError, ValueError, TypeError, BadMessage):
            return None
        return fitted

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def _signal(pid: int) -> None:
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    try:  # a zombie: exited, not yet reaped by torchrun
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')


def main_stack(text: str) -> list[tuple[str, int, str, str]]:
    """The main thread's frames from faulthandler's last dump in `text` (file, line, function,
    the source line), innermost first."""
    lines = text.splitlines()
    main = None
    if lines and lines[0].startswith("main thread "):
        main = int(lines[0].split()[-1], 16)
    # The last dump: from the last header that follows a blank line or the main-thread line.
    blocks: list[tuple[int | None, bool, list[str]]] = []
    for line in lines:
        head = _THREAD.match(line)
        if head:
            blocks.append((int(head.group(2), 16), head.group(1) == "Current thread", []))
        elif blocks and _FRAME.match(line):
            blocks[-1][2].append(line)
    if not blocks:
        return []
    # Dumps are appended: the last dump's blocks are the last ones up to a repeated thread id.
    last: list[tuple[int | None, bool, list[str]]] = []
    ids: set[int | None] = set()
    for block in reversed(blocks):
        if block[0] in ids:
            break
        ids.add(block[0])
        last.append(block)
    chosen = next((b for b in last if b[0] == main), None) or last[-1]
    frames = []
    for line in chosen[2]:
        match = _FRAME.match(line)
        assert match is not None
        file, number, function = match.group(1), int(match.group(2)), match.group(3)
        source = linecache.getline(file, number).strip()[:200] if number else ""
        frames.append((file[-1000:], number, function[:250], source))
    return frames
