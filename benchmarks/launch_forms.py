"""Each launch line a user brings, timed to the job's first step (issue 52): 2 node containers
of the image on a Docker network, started together with `docker run` under a container
platform's variables only (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, and 2 CPU workers a
node), each running one form after `entrypoint run --`: the entrypoint's own torchrun, a user's
torchrun line in its spellings, accelerate's and DeepSpeed's launchers, and start scripts that
run them. Per form: seconds from the `docker run`s to node 0's line `training: rank R on node N
made the job's first step` (as the ranks' beats bring it: within a beat, 1 s) and to node 0's
exit, from the Docker daemon's timestamps; medians of --runs. The trainers are
tests/trainers/'s, as docs/your-trainer.md names them.

Prints a Markdown table; asserts nothing but each job's exit 0.

    python benchmarks/launch_forms.py [--image multinode:dev] [--runs 1] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "trainers")]
from start_cost import epoch, two_nodes, when  # noqa: E402
from user_lines import LAUNCH_LINES, SCRIPTS  # noqa: E402
from user_lines import WORKSPACE as W  # noqa: E402

FIRST = "made the job's first step"
# name: the command after `entrypoint run --`
FORMS = {
    "python ddp_tutorial.py (the entrypoint's torchrun)": ("python", f"{W}/ddp_tutorial.py"),
    **LAUNCH_LINES,
    **{f"bash {script}": ("bash", f"{W}/{script}") for script in SCRIPTS},
}


def one(command: tuple[str, ...], image: str) -> tuple[float, float]:
    """Seconds from the `docker run`s to node 0's first-step line, and to the last node's exit."""
    began, logs, states = two_nodes(
        "forms",
        W,
        lambda r, master: [
            "-e", "NNODES=2", "-e", f"NODE_RANK={r}", "-e", f"MASTER_ADDR={master}",
            "-e", "MASTER_PORT=29500", "-e", "ENTRYPOINT_NPROC_PER_NODE=2",
            image, "run", "--", *command,
        ],
    )  # fmt: skip
    first = when(logs, FIRST)
    failed = [s["ExitCode"] for s in states if s["ExitCode"] != 0]
    if first is None or failed:
        tail = "\n".join(logs.splitlines()[-30:])
        raise SystemExit(f"{' '.join(command)}: exits {failed}, first step {first}:\n{tail}")
    ended = max(epoch(s["FinishedAt"]) for s in states)
    return first - began, ended - began


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--image", default="multinode:dev")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="forms whose names hold one of these words")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    forms = {k: v for k, v in FORMS.items() if not args.only or any(w in k for w in args.only)}
    rows = []
    for name, command in forms.items():
        seen = [one(command, args.image) for _ in range(args.runs)]
        first, end = (statistics.median(x[k] for x in seen) for k in (0, 1))
        print(f"{name}: first step {first:.1f} s, job {end:.1f} s", file=sys.stderr)
        rows.append(f"| `{name}` | {first:.1f} s | {end:.1f} s |")
    print(f"| form (median of {args.runs}) | to the first step | to the end |")
    print("|---|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
