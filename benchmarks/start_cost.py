"""What `entrypoint run` adds to a job's start, as a user feels it (issue 22): 2 node
containers of the image on a Docker network, started together with `docker run`, running
torch's DDP tutorial (tests/trainers/ddp_tutorial.py, 2 CPU workers a node) either under bare
torchrun (the image's `torchrun`, every flag given by hand) or under `entrypoint run` (the
platform's variables only). Per start: seconds from the `docker run`s to node 0's first
worker line after its process group formed ("Start running basic DDP example on rank 0") and
to its end ("Finished running ... rank 0"), from the Docker daemon's timestamps. The starts
alternate, bare first, so that load drifts on both alike; medians.

Prints figures; asserts nothing.

    python benchmarks/start_cost.py [--image multinode:dev] [--runs 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

TRAINERS = Path(__file__).resolve().parents[1] / "tests" / "trainers"
FORMED = "Start running basic DDP example on rank 0."
FINISHED = "Finished running basic DDP example on rank 0"


def docker(*args: str, check: bool = True) -> str:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if check and out.returncode:
        raise SystemExit(f"docker {' '.join(args[:3])}: {out.stderr.strip()}")
    return out.stdout


def node_args(way: str, image: str, rank: int, master: str) -> list[str]:
    trainer = ["/trainers/ddp_tutorial.py"]
    if way == "torchrun":
        return [
            "--entrypoint", "torchrun", image,
            "--nnodes=2", f"--node-rank={rank}", "--nproc-per-node=2",
            f"--master-addr={master}", "--master-port=29500", *trainer,
        ]  # fmt: skip
    return [
        "-e", "NNODES=2", "-e", f"NODE_RANK={rank}", "-e", f"MASTER_ADDR={master}",
        "-e", "MASTER_PORT=29500", "-e", "ENTRYPOINT_NPROC_PER_NODE=2",
        image, "run", "--", "python", *trainer,
    ]  # fmt: skip


def when(logs: str, text: str) -> float | None:
    """The daemon's timestamp (epoch seconds) of the first line holding `text`."""
    for line in logs.splitlines():
        stamp, _, rest = line.partition(" ")
        if text in rest:
            return epoch(stamp)
    return None


def epoch(stamp: str) -> float:
    """A Docker timestamp (RFC 3339, nanoseconds, UTC) as epoch seconds."""
    return datetime.datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp()


def two_nodes(
    prefix: str, mount: str, args_of: Callable[[int, str], list[str]]
) -> tuple[float, str, list[dict]]:
    """2 node containers on a Docker network of their own, started together with `docker run
    -d` (node `r`'s arguments after the mount: `args_of(r, node 0's name)`), waited for and
    removed: the epoch second they were started, node 0's output with the daemon's timestamps,
    and each container's final State."""
    tag = secrets.token_hex(3)
    net = f"{prefix}-{tag}"
    names = [f"{prefix}-{tag}-node-{r}" for r in range(2)]
    docker("network", "create", net)
    try:
        began = time.time()
        runs = [
            threading.Thread(
                target=docker,
                args=(
                    "run", "-d", "--name", names[r], "--hostname", names[r], "--network", net,
                    "--shm-size=1g", "-v", f"{TRAINERS}:{mount}:ro", *args_of(r, names[0]),
                ),
            )
            for r in range(2)
        ]  # fmt: skip
        for t in runs:
            t.start()
        for t in runs:
            t.join()
        for name in names:
            docker("wait", name)
        out = subprocess.run(
            ["docker", "logs", "--timestamps", names[0]], capture_output=True, text=True
        )
        states = [json.loads(docker("inspect", "--format", "{{json .State}}", n)) for n in names]
        return began, out.stdout + out.stderr, states  # the container's stdout and stderr
    finally:
        docker("rm", "-f", *names, check=False)
        docker("network", "rm", net, check=False)


def start(way: str, image: str) -> tuple[float, float]:
    began, logs, _ = two_nodes("start", "/trainers", lambda r, m: node_args(way, image, r, m))
    formed, finished = when(logs, FORMED), when(logs, FINISHED)
    if formed is None or finished is None:
        tail = "\n".join(logs.splitlines()[-30:])
        raise SystemExit(f"{way}: node 0 never finished:\n{tail}")
    return formed - began, finished - began


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--image", default="multinode:dev")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    seen: dict[str, list[tuple[float, float]]] = {"torchrun": [], "entrypoint run": []}
    for i in range(args.runs):
        for way in seen:
            formed, finished = start(way, args.image)
            seen[way].append((formed, finished))
            print(
                f"run {i + 1} {way:<15} process group {formed:5.2f} s, finished {finished:5.2f} s"
            )
    med = {way: [statistics.median(x[k] for x in v) for k in (0, 1)] for way, v in seen.items()}
    for way, (formed, finished) in med.items():
        print(f"{way:<15} median: process group formed {formed:5.2f} s, finished {finished:5.2f} s")
    added = [med["entrypoint run"][k] - med["torchrun"][k] for k in (0, 1)]
    print(
        f"added by the entrypoint: {added[0]:+.2f} s to the process group, "
        f"{added[1]:+.2f} s to the end (medians of {args.runs})"
    )


if __name__ == "__main__":
    main()
