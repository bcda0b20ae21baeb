"""A soak of the control channel with no fault: real `entrypoint run` nodes on loopback, every
heartbeat setting at its default, a trainer that runs for the whole soak; the run must end with
exit 0 on every node and no node ever named lost (no false alarm). Run by hand, not in CI:

    python benchmarks/control_soak.py                       # 2 nodes, 30 minutes
    python benchmarks/control_soak.py --minutes 5 --nodes 4 --stress

`--stress` runs stress-ng on every core for the whole soak (the trainer saturating the
machine); `--stall N` stops (SIGSTOP) a random node's entrypoint for N seconds once a minute,
then continues it (SIGCONT): N below the heartbeat timeout less one interval must never be
taken for a lost node. Prints what happened; exit 1 on a false alarm.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loopback import free_ports

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--stress", action="store_true", help="stress-ng on every core")
    parser.add_argument(
        "--stall",
        type=float,
        default=0,
        help="SIGSTOP an entrypoint for this many seconds once a minute (0: never)",
    )
    args = parser.parse_args()
    seconds = args.minutes * 60
    work = Path(tempfile.mkdtemp(prefix="control-soak-"))
    port = free_ports(3)  # node 0's rendezvous, control and metrics ports
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(ROOT),
        "NNODES": str(args.nodes),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "ENTRYPOINT_GPUS_PER_NODE": "0",
        "ENTRYPOINT_LAUNCHER": "direct",
        "ENTRYPOINT_SOCKET_IFNAME": "lo",
        "ENTRYPOINT_RUN_DIR": str(work / "run"),
        "ENTRYPOINT_LOG_ALL_NODES": "true",
        "ENTRYPOINT_MONITOR_INTERVAL": "60",
    }
    trainer = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    nodes = []
    for rank in range(args.nodes):
        log = open(work / f"node{rank}.log", "w")
        nodes.append(
            subprocess.Popen(
                [sys.executable, "-m", "entrypoint", "run", "--", *trainer],
                env=env | {"NODE_RANK": str(rank)},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    stress = None
    if args.stress:
        if shutil.which("stress-ng") is None:
            print("stress-ng is not installed (apt-get install stress-ng)")
            return 2
        stress = subprocess.Popen(
            ["stress-ng", "--cpu", "0", "--timeout", f"{int(seconds) + 60}s", "--quiet"]
        )
    began = time.monotonic()
    stalls = 0
    print(
        f"soak: {args.nodes} nodes on loopback for {args.minutes:g} min, default heartbeats"
        f"{', stress-ng on every core' if stress else ''}"
        f"{f', a {args.stall:g} s stall a minute' if args.stall else ''}; logs in {work}",
        flush=True,
    )
    try:
        next_stall = began + 60
        while any(p.poll() is None for p in nodes):
            now = time.monotonic()
            if args.stall and now >= next_stall and now - began < seconds - 30:
                victim = random.choice(nodes)
                os.kill(victim.pid, signal.SIGSTOP)
                time.sleep(args.stall)
                os.kill(victim.pid, signal.SIGCONT)
                stalls += 1
                next_stall = now + 60
            if now - began > seconds + 120:
                print("soak: the nodes ran past the soak by 2 minutes; stopping them")
                break
            time.sleep(0.5)
    finally:
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if stress is not None:
            stress.kill()
            stress.wait()
    codes = [p.returncode for p in nodes]
    logs = "\n".join((work / f"node{r}.log").read_text() for r in range(args.nodes))
    alarms = [line for line in logs.splitlines() if "lost node" in line or "silent for" in line]
    elapsed = time.monotonic() - began
    print(
        f"soak: {elapsed / 60:.1f} min, exit codes {codes}, {stalls} stalls, "
        f"{len(alarms)} false alarms"
    )
    for line in alarms[:5]:
        print(f"  {line}")
    return 0 if codes == [0] * args.nodes and not alarms else 1


if __name__ == "__main__":
    sys.exit(main())
