"""What `entrypoint local` says at the end: every worker's report, saved and summed up, and
its exit code (entrypoint.local.local)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from entrypoint.local.local import Layout


def summary(results: list[dict], nnodes: int, seconds: float) -> list[str]:
    """What every worker reported, ending with the final loss (the built-in job's reports)."""
    lines = ["", "local: every worker's report (<output>/results/rank<R>.json):"]
    for r in results:
        writer = "  wrote the checkpoint" if r["checkpoint_writer"] else ""
        lines.append(
            f"  rank {r['rank']} of {r['world_size']} on {r['node']} (node "
            f"{r['node_rank']}, local rank {r['local_rank']}){writer}"
        )
    first = results[0]
    lines.append(
        f"local: {first['job']} on {nnodes} nodes x {len(results) // nnodes} workers, "
        f"{first['steps']} steps in {seconds:.0f} s; final loss {first['final_loss']:.4f} "
        f"(first {first['first_loss']:.4f})"
    )
    return lines


def save_results(results: list[dict], directory: str) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for r in results:
        (out / f"rank{r['rank']}.json").write_text(json.dumps(r, indent=2) + "\n")


def verdict(run, results_dir: str | None, command: list[str], plan: Layout, node0: str) -> int:
    """Save the reports, say how the run went, and its exit code. With spares or a minimum,
    node 0's exit is the job's: a node lost on the way is said, not a failure."""
    if results_dir:
        save_results(run.results, results_dir)
    lost = {name: code for name, code in run.exit_codes.items() if code != 0}
    elastic = (plan.spares or plan.min_nodes) and not run.timed_out
    problem = None if elastic and run.exit_codes.get(node0) == 0 else run.problem()
    if elastic and lost and not problem:
        print(f"local: lost {lost} on the way; the job went on without them")
    if problem:
        print(f"local: FAILED: {problem}", file=sys.stderr)
        return 1
    if command:  # the user's own trainer: its exit codes are the verdict
        print(f"local: every node exited 0 in {run.seconds:.0f} s")
        return 0
    results = run.results
    expected = results[0]["world_size"] if results else 0
    if not results or len(results) != expected:
        print(f"local: FAILED: {len(results)} worker reports, expected {expected}", file=sys.stderr)
        return 1
    nodes = len({r["node_rank"] for r in results})
    for line in summary(results, nodes, run.seconds):
        print(line)
    return 0
