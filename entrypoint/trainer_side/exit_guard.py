"""A trainer's interpreter exits while gloo's worker threads still hold its tensors.

After a collective completes, the main thread goes on while the gloo worker that ran it is
still dropping the work and its tensors, which takes the GIL. If the main thread has begun
to tear the interpreter down by then, Python 3.13 ends the worker thread from inside C++
and the process aborts after the trainer finished: `terminate called without an active
exception`, exit 134 or 139 (seen with accelerate's quick tour on CPU nodes, in about one run
in six, and with DeepSpeed's ZeRO-2 on the CPU under plain `python`; the race of
https://github.com/pytorch/pytorch/pull/179291). In the image, its .pth file registers `settle`
in every Python process (trainer_side/every_process.py); elsewhere the entrypoint's site hook
does. Either registers it first, so it runs last of the exit handlers, while the interpreter is
still whole: it destroys a gloo process group left open, collects the cycles that keep other
groups alive (their destructors join gloo's threads with the GIL released), then, if threads
that Python did not start are still alive beyond those `import torch` left (a group still
referenced keeps its gloo workers), releases the GIL for SETTLE_SECONDS so that a worker still
finishing its last collective can do so. A trainer's own destroy_process_group() leaves no
trace of the group having been (torch resets its counters), so the threads are what is counted:
a process that only imported torch (a DataLoader worker started with spawn, a script printing
torch.__version__, torchrun's agent with no store) exits at once. It runs in every process that
imported torch.distributed (`import torch` does), and in no other; without /proc it always
waits. Not after an uncaught exception (Python has printed it and set `sys.last_exc`): a
failing rank exits at once, so that the launcher names it, not a peer that failed because of
it; and it exits with its code, 1, through `os._exit` once every other exit handler has run,
skipping the teardown in which gloo's threads would abort it (a rank that raised was reported
as `exit code 134`, killed by SIGABRT, with `terminate called without an active exception`:
2 nodes of the built-in job beside stress-ng, tests/cluster/test_faults.py).
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import time
from types import ModuleType

from entrypoint.trainer_side import after_import

SETTLE_SECONDS = 0.5
_TASKS = "/proc/self/task"
_native_at_import: int | None = None  # threads Python did not start, once torch was imported
_installed = False


def native_threads() -> int | None:
    """This process's threads that Python did not start (gloo's, OpenMP's), or None unknown."""
    try:
        import threading  # here, not as every Python process of the image starts: torch has it

        return len(os.listdir(_TASKS)) - threading.active_count()
    except OSError:
        return None


def _note_threads(_module: ModuleType) -> None:
    global _native_at_import
    _native_at_import = native_threads()


def threads_left() -> bool:
    now = native_threads()
    return now is None or _native_at_import is None or now > _native_at_import


def failed() -> bool:
    return getattr(sys, "last_exc", None) is not None or getattr(sys, "last_type", None) is not None


def settle() -> None:
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and failed():
        _exit_failed()
    try:
        if distributed is None or not distributed.is_available():
            return
        if distributed.is_initialized() and distributed.get_backend() == "gloo":
            distributed.destroy_process_group()  # local for gloo; NCCL's is left to the trainer
        gc.collect()
        if threads_left():
            time.sleep(SETTLE_SECONDS)
    except Exception:  # noqa: BLE001 - at exit, a failed clean-up must not change the exit code
        pass


def install() -> None:
    """Register `settle` at exit (a gloo group left open destroyed, gloo's last work given time to
    finish, while the interpreter is whole) and count the native threads once torch.distributed
    loads; once per process (the image's .pth file and the site hook both call it). Raises
    nothing."""
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(settle)
    after_import.when_imported("torch.distributed", _note_threads)


def _exit_failed() -> None:
    """The code of an uncaught exception, 1, without the interpreter's teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stream: nothing left to flush
            pass
    os._exit(1)
