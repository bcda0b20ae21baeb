"""How much `entrypoint plan` adds over `python -c pass`, and proof that the path to exec
imports neither torch, jax nor deepspeed. Prints figures; asserts nothing.

    python benchmarks/startup.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ENV = {
    "PATH": os.environ.get("PATH", ""),
    "HOME": os.environ.get("HOME", "/tmp"),
    # A 2 x 8 hand-started node; the GPU count is stated, so nothing is probed but the network.
    "NNODES": "2",
    "NODE_RANK": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "ENTRYPOINT_GPUS_PER_NODE": "8",
}


def timed(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=ENV, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def heavy_imports() -> list[str]:
    probe = (
        "import sys, runpy; sys.argv=['entrypoint','plan','--json']\n"
        "try:\n    runpy.run_module('entrypoint', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print(','.join(m for m in ('torch','jax','deepspeed','numpy') if m in sys.modules),"
        " file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=ENV, capture_output=True, text=True)
    lines = out.stderr.strip().splitlines()
    return [m for m in (lines[-1] if lines else "").split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    bare = timed([sys.executable, "-c", "pass"], runs)
    plan = timed([sys.executable, "-m", "entrypoint", "plan", "--json"], runs)
    print(f"python -c pass            {bare * 1000:7.1f} ms (median of {runs})")
    print(f"entrypoint plan --json    {plan * 1000:7.1f} ms (median of {runs})")
    print(f"added by the entrypoint   {(plan - bare) * 1000:7.1f} ms   (goal: under 300 ms)")
    heavy = heavy_imports()
    none = "none (torch, jax, deepspeed, numpy)"
    print(f"heavy modules imported    {', '.join(heavy) if heavy else none}")


if __name__ == "__main__":
    main()
