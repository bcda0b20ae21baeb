"""What the preflight costs before the first training step: every node joins node 0 over the
entrypoints' channel and node 0 compares their fingerprints (entrypoint/supervise/join.py and
supervise.py).

Simulated nodes are processes on loopback. Each does what a node's entrypoint does before
launch: probe.fingerprint() (files, package metadata), connect to node 0's control_server.Server,
send its hello, wait for `go`. Python start-up and imports happen before the clock starts (a
real node pays them once, whatever the preflight). Prints figures; asserts nothing.

    python benchmarks/preflight.py [--nodes 2,8,32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace


def node(member: int, port: int, n: int) -> None:
    """One simulated node: ready, wait for the start line, then join as the supervisor does."""
    from entrypoint.control import control_channel
    from entrypoint.control import messages as m
    from entrypoint.control.node_fingerprint import PlannedShape
    from entrypoint.supervise import probe

    print("ready", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    fp = probe.fingerprint(gpus_per_node=0, gpu_names=(), data_dir=None)
    fp = replace(
        fp,
        layout=PlannedShape(
            nnodes=n,
            node_rank=member,
            nproc_per_node=1,
            world_size=n,
            master_addr="127.0.0.1",
            master_port=port - 1,
            launcher="torchrun",
        ),
    )
    collected = time.monotonic()
    channel = control_channel.connect("127.0.0.1", port, timeout=60, log=lambda line: None)
    hello = m.Hello(
        member=member,
        host=f"sim-{member}",
        fingerprint=fp,
        time=time.time(),
        node_rank=member,
        generation=0,
    )
    channel.send(hello)
    while not any(isinstance(msg, m.Go) for msg in channel.receive(1.0)):
        if channel.closed:
            raise SystemExit(f"node {member}: node 0 closed the channel")
    done = time.monotonic()
    channel.close()
    print(
        json.dumps(
            {
                "start": start,
                "collect": collected - start,
                "done": done,
                "hello_bytes": len(m.encode(hello)),
            }
        ),
        flush=True,
    )


def once(n: int) -> dict:
    from entrypoint.control import control_server
    from entrypoint.coordinator.conductor import Conductor
    from entrypoint.coordinator.state import Limits

    conductor = Conductor(n, Limits(join_timeout=120), time.monotonic(), address="bench")
    server = control_server.Server(
        conductor, 0, heartbeat_interval=5, log=lambda level, text: None, bind="127.0.0.1"
    )
    server.start()
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                os.environ.get("PYTHONPATH", ""),
            ]
        ),
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--member",
                str(m),
                "--port",
                str(server.port),
                "--nodes",
                str(n),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for m in range(n)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        began = time.monotonic()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [json.loads(proc.stdout.readline()) for proc in procs]
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        server.stop()
    return {
        "wall": max(r["done"] for r in results) - began,
        "collect": statistics.median(r["collect"] for r in results),
        "hello_bytes": results[0]["hello_bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="2,8,32", help="node counts (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per count; the median shows")
    parser.add_argument("--member", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.member is not None:
        node(args.member, args.port, int(args.nodes))
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"join + fingerprint comparison, simulated nodes on loopback ({cores} CPU cores, "
        f"median of {args.repeat})"
    )
    print(f"{'nodes':>6} {'join + check':>14} {'collect/node':>14} {'hello':>9}")
    for n in (int(x) for x in args.nodes.split(",")):
        runs = [once(n) for _ in range(args.repeat)]
        wall = statistics.median(r["wall"] for r in runs)
        collect = statistics.median(r["collect"] for r in runs)
        print(
            f"{n:>6} {wall * 1000:>11.0f} ms {collect * 1000:>11.1f} ms "
            f"{runs[0]['hello_bytes'] / 1024:>6.1f} kB",
            flush=True,
        )


if __name__ == "__main__":
    main()
