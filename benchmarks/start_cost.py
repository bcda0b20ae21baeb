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
import secrets
import statistics
import subprocess
import sys
import threading
import time
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
            return datetime.datetime.fromisoformat(stamp[:26] + "+00:00").timestamp()
    return None


def start(way: str, image: str, timeout: float) -> tuple[float, float]:
    tag = secrets.token_hex(3)
    net = f"start-{tag}"
    names = [f"start-{tag}-node-{r}" for r in range(2)]
    docker("network", "create", net)
    try:
        began = time.time()
        runs = [
            threading.Thread(
                target=docker,
                args=(
                    "run", "-d", "--name", names[r], "--hostname", names[r], "--network", net,
                    "--shm-size=1g", "-v", f"{TRAINERS}:/trainers:ro",
                    *node_args(way, image, r, names[0]),
                ),
            )
            for r in range(2)
        ]  # fmt: skip
        for t in runs:
            t.start()
        for t in runs:
            t.join()
        docker("wait", names[0])  # the job ends: the DDP tutorial is 5 steps
        out = subprocess.run(
            ["docker", "logs", "--timestamps", names[0]], capture_output=True, text=True
        )
        logs = out.stdout + out.stderr  # the container's stdout and stderr
        formed, finished = when(logs, FORMED), when(logs, FINISHED)
        if formed is None or finished is None:
            tail = "\n".join(logs.splitlines()[-30:])
            raise SystemExit(f"{way}: node 0 never finished:\n{tail}")
        return formed - began, finished - began
    finally:
        docker("rm", "-f", *names, check=False)
        docker("network", "rm", net, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--image", default="multinode:dev")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    seen: dict[str, list[tuple[float, float]]] = {"torchrun": [], "entrypoint run": []}
    for i in range(args.runs):
        for way in seen:
            formed, finished = start(way, args.image, args.timeout)
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
