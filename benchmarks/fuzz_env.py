"""Fuzz the path environment -> plan: draw hostile environments for every platform convention,
plan each in process (what `entrypoint plan` and `run` do before anything starts), and count
the outcomes. Reports every traceback (an exception other than the one-line ConfigError), every
broken plan invariant and every case over the time limit, with the environment to reproduce it.
Run by hand, not in CI; exit 1 if anything was found.

    python benchmarks/fuzz_env.py [--cases 100000] [--seed 0] [--limit-s 1.0]

The cases come from tests/unit/hostile_env.py, the same pools the hypothesis tests draw from.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "unit")]

from hostile_env import draw, plan_once, violations  # noqa: E402 - found through sys.path above

from entrypoint.plan.errors import ConfigError  # noqa: E402 - the repository, put on sys.path above


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit-s", type=float, default=1.0, help="slowest allowed case")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    outcomes: collections.Counter[str] = collections.Counter()
    refusals: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    slowest = (0.0, None)  # by CPU time: wall time on a shared machine measures the others too
    slowest_wall = 0.0
    started = time.perf_counter()
    for case in range(args.cases):
        env, node, command = draw(rng.choice)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            plan = plan_once(env, node, command)
        except ConfigError as err:
            line = err.line()
            outcomes["refused (one ConfigError line)"] += 1
            refusals[err.variable] += 1
            if "\n" in line:
                problems.append(
                    f"case {case}: a refusal of more than one line: {line!r}\n  env={env!r}"
                )
        except Exception:  # noqa: BLE001 - any other exception is what this script hunts
            outcomes["traceback"] += 1
            problems.append(
                f"case {case}: traceback\n  env={env!r} gpus="
                f"{None if node.gpus is None else len(node.gpus)} command={command}"
                f"\n{traceback.format_exc()}"
            )
        else:
            broken = violations(plan, node)
            outcomes["planned, invariants broken" if broken else "planned"] += 1
            if broken:
                problems.append(f"case {case}: {broken}\n  env={env!r}")
        took, wall = time.process_time() - c0, time.perf_counter() - t0
        slowest_wall = max(slowest_wall, wall)
        if took > slowest[0]:
            slowest = (took, env)
        if took > args.limit_s:
            outcomes[f"over {args.limit_s:g} s of CPU"] += 1
            problems.append(f"case {case}: {took:.2f} s of CPU\n  env={str(env)[:500]}")
    total = time.perf_counter() - started

    print(
        f"fuzz_env: {args.cases} environments (seed {args.seed}) in {total:.1f} s, "
        f"{total / args.cases * 1e3:.2f} ms each on average; slowest {slowest[0] * 1e3:.0f} ms "
        f"of CPU, {slowest_wall * 1e3:.0f} ms of wall time"
    )
    for outcome, n in outcomes.most_common():
        print(f"  {outcome:<32} {n:>7}")
    print(f"  slowest case (CPU): {str(slowest[1])[:300]}")
    print("  most refused variables: " + ", ".join(f"{v} {n}" for v, n in refusals.most_common(8)))
    for problem in problems[:20]:
        print(problem)
    if len(problems) > 20:
        print(f"... and {len(problems) - 20} more")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
