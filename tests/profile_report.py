"""The table of a profiled test run (`make test-profile`): every test file's wall and CPU time,
and where the time goes.

    python tests/profile_report.py DIR            the table, from DIR's lines (tests/profiling.py)
    python tests/profile_report.py DIR --costs    first, what one of each unit of cost takes here:
                                                  a Python start, torch's and JAX's imports, a
                                                  node container's start (IMAGE)

DIR holds tests-*.jsonl (one line per test) and, when Docker ran, containers.jsonl (`docker
events`: one line per container start), which the report counts within each test's window.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

COLUMNS = (
    "file",
    "tests",
    "wall s",
    "CPU s",
    "machine CPU s",
    "sleep s",
    "processes",
    "containers",
)


def load(directory: Path) -> tuple[list[dict], list[float]]:
    rows = [
        json.loads(line)
        for path in sorted(directory.glob("tests-*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    starts: list[float] = []
    events = directory / "containers.jsonl"
    if events.exists():
        for line in events.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("status") == "start" or event.get("Action") == "start":
                starts.append(event.get("timeNano", 0) / 1e9 or float(event.get("time", 0)))
    return rows, starts


def by_file(rows: list[dict], starts: list[float]) -> list[dict]:
    files: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        f = files[row["file"]]
        f["tests"] += 1
        for key in ("wall", "cpu", "machine", "sleep", "forks"):
            f[key] += row[key]
        f["containers"] += sum(1 for t in starts if row["start"] <= t <= row["end"])
        f["first"] = min(f.get("first", row["start"]), row["start"])
        f["last"] = max(f.get("last", 0.0), row["end"])
    return [{"file": name, **values} for name, values in files.items()]


def table(files: list[dict]) -> str:
    files = sorted(files, key=lambda f: -f["wall"])
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for f in files:
        lines.append(
            f"| {f['file']} | {int(f['tests'])} | {f['wall']:.0f} | {f['cpu']:.0f} | "
            f"{f['machine']:.0f} | {f['sleep']:.0f} | {int(f['forks'])} | {int(f['containers'])} |"
        )
    total = {k: sum(f[k] for f in files) for k in ("tests", "wall", "cpu", "machine", "sleep")}
    span = max(f["last"] for f in files) - min(f["first"] for f in files) if files else 0
    lines.append(
        f"| **all ({span:.0f} s from first to last)** | {int(total['tests'])} | "
        f"{total['wall']:.0f} | {total['cpu']:.0f} | {total['machine']:.0f} | "
        f"{total['sleep']:.0f} | {int(sum(f['forks'] for f in files))} | "
        f"{int(sum(f['containers'] for f in files))} |"
    )
    return "\n".join(lines)


def _timed(command: list[str], runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.monotonic()
        subprocess.run(command, check=True, capture_output=True)
        best = min(best, time.monotonic() - start)
    return best


def costs(image: str) -> str:
    py = sys.executable
    found = [
        ("a Python start (`python -c pass`)", _timed([py, "-c", "pass"])),
        ("`python -m entrypoint --help`", _timed([py, "-m", "entrypoint", "--help"])),
        ("`import torch`", _timed([py, "-c", "import torch"])),
        ("`import torch.distributed` + a gloo group of 1", _timed([py, "-c", GLOO_OF_ONE])),
    ]
    try:
        found.append(("`import jax`", _timed([py, "-c", "import jax"])))
    except (subprocess.CalledProcessError, FileNotFoundError):
        pass
    docker = os.environ.get("DOCKER", "docker")
    try:
        found.append(
            (
                f"a container of {image} started and gone (`docker run --rm IMAGE --help`)",
                _timed([docker, "run", "--rm", image, "--help"]),
            )
        )
    except (subprocess.CalledProcessError, FileNotFoundError):
        pass
    rows = ["| one of these | seconds (best of 3) |", "|---|---|"]
    rows += [f"| {what} | {seconds:.2f} |" for what, seconds in found]
    return "\n".join(rows)


GLOO_OF_ONE = (
    "import os, torch.distributed as d; os.environ.update(MASTER_ADDR='127.0.0.1', "
    "MASTER_PORT='0'); d.init_process_group('gloo', rank=0, world_size=1, "
    "init_method='tcp://127.0.0.1:0'); d.destroy_process_group()"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--costs", action="store_true", help="measure the unit costs first")
    parser.add_argument("--image", default=os.environ.get("IMAGE", "multinode:dev"))
    args = parser.parse_args()
    if args.costs:
        print(costs(args.image), end="\n\n")
    rows, starts = load(args.directory)
    if not rows:
        sys.exit(f"{args.directory}: no tests-*.jsonl lines (TEST_PROFILE={args.directory} pytest)")
    print(table(by_file(rows, starts)))


if __name__ == "__main__":
    main()
