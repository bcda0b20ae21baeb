"""A connection flood against node 0's control port while a node joins (issue 28), on
loopback: real `entrypoint run` processes for node 0 and node 1 (a job token, the fault
trainer for a few steps), and flooder processes that open connections to node 0's control
port as fast as they can from the same address as node 1, each holding --hold of them
open and saying nothing. Per trial: whether both nodes finished with exit 0, the seconds from
node 1's start to its worker's first step (join, handshake, go, torchrun's rendezvous), how
many times node 1 joined again, and the flood's connection attempts per second (non-blocking
connects). Before issue 28's fix, node 1 joined in none of 4 such trials (exit 75); the
issue's own attack, about 13,000 connections a second, let it join in 4 of 8.

Prints figures; asserts nothing.

    python benchmarks/control_flood.py [--trials 8] [--flooders 3] [--hold 500]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loopback import free_ports

ROOT = Path(__file__).resolve().parents[1]
TRAINER = str(ROOT / "tests" / "fault_trainer.py")
TOKEN = "c41f9a7e2b6d08e35f1a9c7b4e2d6f80"  # benchmark-only

FLOODER = r"""
import collections, signal, socket, sys
port, hold = int(sys.argv[1]), int(sys.argv[2])
held, opened = collections.deque(), 0
def done(*_):
    print(opened, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:  # non-blocking: a full accept queue holds up no other connection
    s = socket.socket()
    s.setblocking(False)
    if s.connect_ex(("127.0.0.1", port)) not in (0, 115):  # 115: EINPROGRESS
        s.close()
        continue
    opened += 1
    held.append(s)
    if len(held) > hold:
        held.popleft().close()
"""


def node(rank: int, port: int, tmp: Path, collective: int) -> subprocess.Popen:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONUNBUFFERED": "1",
        "NNODES": "2",
        "NODE_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "ENTRYPOINT_GPUS_PER_NODE": "0",
        "ENTRYPOINT_NPROC_PER_NODE": "1",
        "ENTRYPOINT_SOCKET_IFNAME": "lo",
        "ENTRYPOINT_JOB_TOKEN": TOKEN,
        "ENTRYPOINT_RUN_DIR": str(tmp / "run"),
        "FAULT_OUT": str(tmp / "out"),
        "FAULT_STEPS": "5",
        "FAULT_PORT": str(collective),
    }
    log = open(tmp / f"node{rank}.log", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "run", "--", sys.executable, TRAINER],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        start_new_session=True,
    )


def trial(flooders: int, hold: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        port = free_ports(4)  # node 0's rendezvous, control and metrics ports, then the trainer's
        collective = port + 3
        zero = node(0, port, tmp, collective)
        time.sleep(2)  # node 0 serves its control port
        flood = [
            subprocess.Popen(
                [sys.executable, "-c", FLOODER, str(port + 1), str(hold)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(flooders)
        ]
        time.sleep(2)  # the flood at full rate before node 1 starts
        began = time.monotonic()
        one = node(1, port, tmp, collective)
        joined = None
        while one.poll() is None and time.monotonic() - began < timeout:
            if joined is None and any((tmp / "out").glob("started1.*")):
                joined = time.monotonic() - began
            time.sleep(0.1)
        flooded = time.monotonic() - began + 2
        opened = 0
        for proc in flood:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=10)
            opened += int(out.strip() or 0)
        codes = []
        for proc in (zero, one):
            try:
                codes.append(proc.wait(timeout=max(1.0, timeout - (time.monotonic() - began))))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes.append(proc.wait())
        log1 = (tmp / "node1.log").read_text()
        return {
            "codes": codes,
            "joined": joined,
            "rate": opened / flooded,
            "rejoins": log1.count("joining again in"),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--flooders", type=int, default=3, help="flooder processes")
    parser.add_argument("--hold", type=int, default=500, help="connections each holds open")
    parser.add_argument("--timeout", type=float, default=120.0, help="per trial, seconds")
    args = parser.parse_args()
    results = []
    for i in range(args.trials):
        r = trial(args.flooders, args.hold, args.timeout)
        results.append(r)
        joined = f"{r['joined']:.1f} s" if r["joined"] is not None else "never"
        print(
            f"trial {i + 1}: exit codes {r['codes']}, node 1's worker started after {joined} "
            f"({r['rejoins']} rejoins), flood {r['rate']:,.0f} connection attempts/s",
            flush=True,
        )
    ok = [r for r in results if r["codes"] == [0, 0]]
    times = [r["joined"] for r in results if r["joined"] is not None] or [float("nan")]
    rates = [r["rate"] for r in results]
    print(
        f"MEASURED flood: {len(ok)} of {len(results)} trials joined and finished with exit 0; "
        f"seconds to node 1's first step median {statistics.median(times):.1f}, max "
        f"{max(times):.1f}; flood median {statistics.median(rates):,.0f} connection attempts/s"
    )


if __name__ == "__main__":
    main()
