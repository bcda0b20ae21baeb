"""`python -m entrypoint.trainer_side.local_rank_arg [--first] TRAINER...`: run the trainer as
written, with its local rank as an argument, where the launcher it was written for gives it:
- `--local_rank=N` after its arguments, as DeepSpeed's launcher (`deepspeed train.py`) gives it;
- with `--first`, `--local-rank=N` before its arguments, as `python -m torch.distributed.launch`
  gives it without `--use-env` (torch/distributed/run.py, config_from_args).
A script written for either launcher reads its local rank there (`parser.add_argument(
"--local_rank", ...)`), and torchrun, which the entrypoint runs in the launcher's place, gives it
in LOCAL_RANK only. TRAINER is `python script.py ARGS`, `python -m module ARGS` or a program;
a script runs in this process (the site hook stays loaded), as `python script.py` runs it."""

from __future__ import annotations

import os
import runpy
import sys


def main(argv: list[str]) -> None:
    first = bool(argv) and argv[0] == "--first"
    argv = argv[1:] if first else argv
    if not argv:
        sys.exit("local_rank_arg: give the trainer's command")
    rank = os.environ.get("LOCAL_RANK", "0")
    local = [f"--local-rank={rank}"] if first else [f"--local_rank={rank}"]

    def placed(args: list[str]) -> list[str]:
        return [*local, *args] if first else [*args, *local]

    head, rest = argv[0], argv[1:]
    if os.path.basename(head).startswith("python") and rest and rest[0] == "-m" and len(rest) > 1:
        sys.argv = [rest[1], *placed(rest[2:])]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    elif os.path.basename(head).startswith("python") and rest and not rest[0].startswith("-"):
        script = rest[0]
        sys.argv = [script, *placed(rest[1:])]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")
    else:
        os.execvp(head, [head, *placed(rest)])


if __name__ == "__main__":
    main(sys.argv[1:])
