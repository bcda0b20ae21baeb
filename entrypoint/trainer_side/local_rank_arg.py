"""`python -m entrypoint.trainer_side.local_rank_arg TRAINER...`: run the trainer as written,
with `--local_rank=N` after its arguments, as DeepSpeed's launcher (`deepspeed train.py`) gives
its scripts: a script written for that launcher reads its local rank there (`parser.add_argument(
"--local_rank", ...)`), and torchrun, which the entrypoint runs in the launcher's place, gives it
in LOCAL_RANK only. TRAINER is `python script.py ARGS`, `python -m module ARGS` or a program;
a script runs in this process (the site hook stays loaded), as `python script.py` runs it."""

from __future__ import annotations

import os
import runpy
import sys


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("local_rank_arg: give the trainer's command")
    local = f"--local_rank={os.environ.get('LOCAL_RANK', '0')}"
    head, rest = argv[0], argv[1:]
    if os.path.basename(head).startswith("python") and rest and rest[0] == "-m" and len(rest) > 1:
        sys.argv = [rest[1], *rest[2:], local]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    elif os.path.basename(head).startswith("python") and rest and not rest[0].startswith("-"):
        script = rest[0]
        sys.argv = [script, *rest[1:], local]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")
    else:
        os.execvp(head, [head, *rest, local])


if __name__ == "__main__":
    main(sys.argv[1:])
