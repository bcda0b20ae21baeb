"""Run a user's trainer unchanged, with one rank hanging inside its optimizer step: how the
tests make the Hugging Face Trainer, accelerate's quick tour or an FSDP2 trainer hang without
editing them. HANG_RANK (global rank), HANG_STEP (its optimizer step), HANG_SECONDS (default an
hour). Nothing of this project is imported.

    python hang_wrapper.py TRAINER.py [ARGS...]
"""

import os
import runpy
import sys
import time

from torch.optim.optimizer import register_optimizer_step_post_hook

RANK = int(os.environ.get("RANK", "-1"))
HANG_RANK = int(os.environ.get("HANG_RANK", "-1"))
HANG_STEP = int(os.environ.get("HANG_STEP", "3"))
SECONDS = float(os.environ.get("HANG_SECONDS", "3600"))
steps = 0


def hang(_optimizer, _args, _kwargs):
    global steps
    steps += 1
    if RANK == HANG_RANK and steps == HANG_STEP:
        print(f"hang_wrapper: rank {RANK} hangs after optimizer step {steps}", flush=True)
        time.sleep(SECONDS)


register_optimizer_step_post_hook(hang)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
