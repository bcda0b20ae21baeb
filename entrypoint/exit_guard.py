"""A trainer's interpreter exits while gloo's worker threads still hold its tensors.

After a collective completes, the main thread goes on while the gloo worker that ran it is
still dropping the work and its tensors, which takes the GIL. If the main thread has begun
to tear the interpreter down by then, Python 3.13 ends the worker thread from inside C++
and the process aborts after the trainer finished: `terminate called without an active
exception`, exit 134 (seen with accelerate's quick tour on CPU nodes, in about one run in
six; the race of https://github.com/pytorch/pytorch/pull/179291). The site hook registers
`settle` first, so it runs last of the exit handlers, while the interpreter is still whole:
it destroys a gloo process group left open, collects the cycles that keep other groups alive
(their destructors join gloo's threads with the GIL released), then releases the GIL for
SETTLE_SECONDS so that a worker still finishing its last collective can do so. A trainer's
own destroy_process_group() leaves no trace of the group having been (torch resets its
counters), so this runs in every process that imported torch.distributed (`import torch`
does), and in no other. Not after an uncaught exception (Python has printed it and set
`sys.last_exc`): a failing rank exits at once, so that the launcher names it, not a peer that
failed because of it.
"""

from __future__ import annotations

import atexit
import gc
import sys
import time

SETTLE_SECONDS = 0.5


def failed() -> bool:
    return getattr(sys, "last_exc", None) is not None or getattr(sys, "last_type", None) is not None


def settle() -> None:
    distributed = sys.modules.get("torch.distributed")
    try:
        if distributed is None or not distributed.is_available() or failed():
            return
        if distributed.is_initialized() and distributed.get_backend() == "gloo":
            distributed.destroy_process_group()  # local for gloo; NCCL's is left to the trainer
        gc.collect()
        time.sleep(SETTLE_SECONDS)
    except Exception:  # noqa: BLE001 - at exit, a failed clean-up must not change the exit code
        pass


def install() -> None:
    atexit.register(settle)
