"""torch's Flight Recorder, read for the entrypoint when the job stops stepping.

torch records each process group's collectives in a ring (TORCH_FR_BUFFER_SIZE entries; the plan
sets it on every node: gloo's collectives are recorded too, since torch 2.10 at least), and
NCCL's dump it on a timeout. The entrypoint does not wait for that timeout: once a rank has
stepped, `start` binds an abstract Unix datagram socket named after the progress socket and
this process (`<progress socket>.fr.<pid>`) and a daemon thread blocks on it. When the job stops
stepping, the node's entrypoint sends a datagram there; the thread answers by writing every
thread's stack (faulthandler's dump, into the site hook's stack file) and then, if the process
has a process group, `summary()` of the recorder's entries into
`rank<R>.pid<P>.collectives.json` under ENTRYPOINT_STACKS_DIR. A thread, not a signal handler:
Python runs a signal's handler only between bytecodes of the main thread, which is then blocked
in a collective or a sleep. The thread needs the GIL for a moment: a rank stuck in C code that
holds it gives no answer, and gets faulthandler's signal after SIGNAL_AFTER
(entrypoint.supervise.rank_inbox); the entrypoint judges without its collectives.

The summary: for each process group, its last collective as this rank recorded it
([group id, group description, sequence number, operation, what it moved]).
"""

from __future__ import annotations

import faulthandler
import json
import os
import pickle
import socket
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

DETAIL = 80  # characters of an operation's sizes and types


def summary(entries: Iterable[Mapping[str, Any]]) -> list[list]:
    """Each process group's last collective (not point-to-point) of the recorder's entries:
    [group id, group description, sequence number, operation, sizes and types], the groups in
    the order they were first seen, the default group (id "0") first (the node cuts them to
    what node 0 takes)."""
    last: dict[str, Mapping[str, Any]] = {}
    for e in entries:
        seq = e.get("collective_seq_id")
        if e.get("is_p2p") or not isinstance(seq, int):
            continue
        group = e.get("process_group") or ("?",)
        kept = last.get(str(group[0]))
        if kept is None or kept["collective_seq_id"] < seq:
            last[str(group[0])] = e
    out = []
    for gid, e in sorted(last.items(), key=lambda item: item[0] != "0"):
        names: Sequence[Any] = e.get("process_group") or ("?",)
        types = e.get("input_dtypes") or []
        sizes = json.dumps(e.get("input_sizes") or [], separators=(",", ":"))
        detail = f"{str(types[0]).lower() if types else '?'} {sizes}"
        desc = str(names[1]) if len(names) > 1 else ""
        op = str(e.get("profiling_name") or "?")
        out.append([gid, desc, e["collective_seq_id"], op, detail[:DETAIL]])
    return out


def group_timeout() -> float:
    """The default process group's collective timeout in seconds as torch holds it (the
    shortest of its backends': `init_process_group(timeout=...)`, or torch's default), so that
    the entrypoint names a hang before torch's timeout fires; 0 when unknown (no process group,
    a torch that keeps it elsewhere). Never an error."""
    distributed: Any = sys.modules.get("torch.distributed")
    torch: Any = sys.modules.get("torch")
    try:
        if distributed is None or torch is None or not distributed.is_initialized():
            return 0.0
        group = distributed.group.WORLD
        seconds = []
        for device in ("cpu", "cuda"):
            try:
                backend = group._get_backend(torch.device(device))
                seconds.append(backend.options._timeout.total_seconds())
            except Exception:  # noqa: BLE001, S112 - no backend for that device
                continue
        return min((s for s in seconds if s > 0), default=0.0)
    except Exception:  # noqa: BLE001 - never stop the trainer
        return 0.0


def _entries() -> list[dict]:
    """The recorder's entries (gloo's and NCCL's recorders), or none: never an error. Pickled
    by torch in this process, without stack traces: 24 ms for 2,000 entries here (its JSON
    takes 110 ms, with stack traces a second)."""
    c10d: Any = sys.modules.get("torch._C._distributed_c10d")
    out: list[dict] = []
    for name in ("_dump_fr_trace", "_dump_nccl_trace"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            data = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
            out.extend(pickle.loads(data).get("entries") or [])  # noqa: S301 - torch's own bytes
        except Exception:  # noqa: BLE001, S112 - a recorder that cannot answer says nothing
            continue
    return out


class Answerer:
    """The daemon thread that writes this rank's stacks, then its summary, when the entrypoint
    asks. The stacks are faulthandler's dump of every thread, taken here while this thread
    holds the GIL: no other thread runs Python meanwhile, so every frame it reads stays put. A
    dump from faulthandler's signal handler reads them while other threads run, and crashed a
    rank (SIGSEGV) whose own thread was encoding its summary at that instant (2026-12-07); the
    entrypoint sends that signal only to a rank whose thread does not answer (rank_inbox)."""

    def __init__(
        self,
        progress_address: str,
        stacks_dir: str,
        rank: int,
        stack_file: IO[str] | None,
        recorder: bool = True,
    ) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(address(progress_address, os.getpid()))
        self.path = os.path.join(stacks_dir, f"rank{rank}.pid{os.getpid()}.collectives.json")
        self.stack_file, self.recorder = stack_file, recorder
        self.thread = threading.Thread(target=self._serve, name="entrypoint-flight", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                self.sock.recv(64)
            except OSError:
                return
            self.write()

    def write(self) -> None:
        if self.stack_file is not None:
            try:
                faulthandler.dump_traceback(self.stack_file, all_threads=True)
            except (OSError, ValueError, RuntimeError):
                pass
        if self.recorder:
            write(self.path)


def write(path: str) -> None:
    """This process's summary into `path` (whole or not at all)."""
    try:
        text = json.dumps(summary(_entries()))
        with open(path + ".part", "w") as f:
            f.write(text)
        os.replace(path + ".part", path)
    except OSError:
        pass


def address(progress_address: str, pid: int) -> str:
    """The abstract socket a rank's recorder answers on (`progress_address` as the progress
    reports are sent to: "\\0name")."""
    return f"{progress_address}.fr.{pid}"


def start(
    progress_address: str, stacks_dir: str, rank: int, stack_file: IO[str] | None = None
) -> Answerer | None:
    """Answer the entrypoint's requests from now on: this process's stacks into `stack_file`
    (the site hook's), then, once it has a process group, its recorder's summary (a JAX
    process, or one with no process group, answers with its stacks alone)."""
    distributed: Any = sys.modules.get("torch.distributed")
    try:
        recorder = distributed is not None and distributed.is_initialized()
        if not recorder and stack_file is None:
            return None
        return Answerer(progress_address, stacks_dir, rank, stack_file, recorder)
    except Exception:  # noqa: BLE001 - never stop the trainer
        return None
