"""The control plane at fleet scale: node 0's control_server.Server with 64, 256 and 1,024 simulated
nodes on this machine (issue 17).

Node 0 is its own process: the real Server and Conductor with the default settings
(ENTRYPOINT_HEARTBEAT_INTERVAL, ENTRYPOINT_HEARTBEAT_TIMEOUT). The simulated nodes are a few
processes, each driving its share of the nodes over real sockets on loopback: the handshake
(challenge, hello with a real fingerprint from probe.fingerprint(), welcome), then `go`, then
a heartbeat every interval, with 8 GPUs' figures every 10 s, as a GPU node's entrypoint
sends them (control_channel.Channel). Then one
node goes silent (its connection stays open, as a paused node's does) and the time until node
0 stops the job is measured. Prints figures; asserts nothing.

    python benchmarks/control_scale.py [--nodes 64,256,1024] [--steady 20] [--workers 4]
                                       [--scrape 15]

Figures (goals from issue 17):
- join: from the last node's hello to the last node's `go` (goal: 1,024 within 5 s); and from
  the first connection to the last `go`.
- node 0 CPU: node 0's process CPU time per second of steady heartbeats (goal: under 5% of one
  core).
- detection: from the silent node's last heartbeat to `stop` reaching the nodes (goal: within
  10 s; the timeout plus up to one check interval).
- metrics (issue 25): node 0 serves /metrics (entrypoint.metrics.collector) as a job does, and this
  process scrapes it every --scrape seconds through the steady window, as Prometheus would;
  node 0's CPU above includes serving them (goal: under 5% of a core at 1,024 nodes, scraped
  every 15 s). The size and time of one scrape are printed. --scrape 0: no metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import selectors
import socket
import subprocess
import sys
import time
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

GPUS = [
    {
        "util": 97,
        "mem_used_mib": 71_000,
        "mem_total_mib": 81_559,
        "temp_c": 64,
        "power_w": 690,
        "sm_mhz": 1980,
        "sm_max_mhz": 1980,
        "throttle": 0,
        "ecc_uncorrected": 0,
    }
] * 8


def node0(n: int, steady: float, settle: float, scrape: float) -> None:
    """Node 0's process: the real Server; prints its CPU use over the steady window."""
    from entrypoint.control import control_server
    from entrypoint.coordinator.conductor import Conductor
    from entrypoint.coordinator.state import Limits
    from entrypoint.metrics import collector as metrics
    from entrypoint.plan.settings import Settings

    s = Settings.from_env({})
    conductor = Conductor(
        n,
        Limits(join_timeout=300, heartbeat_timeout=s.heartbeat_timeout, monitor_interval=0),
        time.monotonic(),
        address="bench",
    )
    server = control_server.Server(
        conductor,
        0,
        heartbeat_interval=s.heartbeat_interval,
        log=lambda level, text: None,
        bind="127.0.0.1",
    )
    server.start()
    served = (
        metrics.serve(conductor, metrics.Job("bench", "bench", 8), 0, "127.0.0.1", print)
        if scrape
        else None
    )
    print(
        json.dumps(
            {
                "port": server.port,
                "interval": s.heartbeat_interval,
                "timeout": s.heartbeat_timeout,
                "metrics": served.port if served else None,
            }
        ),
        flush=True,
    )
    while conductor.job.phase == "join":
        time.sleep(0.01)
    time.sleep(settle)
    before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.monotonic()
    time.sleep(steady)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"cpu_per_s": cpu / (time.monotonic() - began)}), flush=True)
    server.finished.wait(timeout=120)


class Sim:
    """One simulated node's connection."""

    def __init__(self, member: int) -> None:
        self.member = member
        self.sock: socket.socket | None = None
        self.buffer = b""
        self.hello_at = self.go_at = self.stop_at = None
        self.next_beat = 0.0
        self.last_beat = 0.0
        self.silent = False
        self.beats = 0


def sim_fingerprint():
    """What a simulated GPU node says of itself (every installed package, 8 H100s), with the
    file limit raised for its process's connections."""
    from entrypoint.supervise import probe

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fp = probe.fingerprint(gpus_per_node=8, gpu_names=("NVIDIA H100 80GB HBM3",), data_dir=None)
    return replace(fp, cuda_driver="12")


def hello(member: int, n: int, fp, generation: int = 0):
    """A simulated GPU node's hello: 8 GPUs, node rank `member` of `n`."""
    from entrypoint.control import messages as m
    from entrypoint.control.node_fingerprint import PlannedShape

    layout = PlannedShape(
        nnodes=n,
        node_rank=member,
        nproc_per_node=8,
        world_size=8 * n,
        master_addr="node-0",
        master_port=29500,
        launcher="torchrun",
    )
    return m.Hello(
        member=member,
        host=f"sim-{member}",
        fingerprint=replace(fp, layout=layout),
        time=time.time(),
        node_rank=member,
        generation=generation,
    )


def nodes(
    members: list[int], n: int, port: int, interval: float, silent_member: int, silence_after: float
) -> None:
    """A worker process driving `members`: join, beat, go silent (one of them), report."""
    from entrypoint.control import control_channel
    from entrypoint.control import messages as m
    from entrypoint.control.node_stats import NodeStats

    fp = sim_fingerprint()
    print("ready", flush=True)
    sys.stdin.readline()
    sel = selectors.DefaultSelector()
    sims = [Sim(i) for i in members]
    first_connect = time.monotonic()
    for sim in sims:
        sim.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        channel = control_channel.Channel(sim.sock, "bench")
        sim.channel = channel
        sel.register(sim.sock, selectors.EVENT_READ, sim)
    beats = [m.encode(m.Beat(NodeStats.from_wire({"gpus": GPUS})))] + [
        m.encode(m.Beat())
    ] * 9  # STATS_EVERY
    go_count = 0
    silenced_at = None
    stopped = 0
    deadline = time.monotonic() + 600
    while stopped < len(sims) and time.monotonic() < deadline:
        now = time.monotonic()
        for key, _ in sel.select(timeout=0.05):
            sim = key.data
            try:
                data = sim.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                sel.unregister(sim.sock)
                sim.stop_at = sim.stop_at or time.monotonic()
                stopped += 1
                continue
            for line in sim.channel.lines.feed(data):
                msg = m.decode(line, m.FROM_NODE_0)
                if isinstance(msg, m.Challenge):
                    sim.channel.challenge = msg
                    sim.channel.send(hello(sim.member, n, fp))
                    sim.sock.setblocking(False)
                    sim.hello_at = time.monotonic()
                elif isinstance(msg, m.Go):
                    sim.go_at = time.monotonic()
                    sim.next_beat = sim.go_at + random.random() * interval
                    go_count += 1
                elif isinstance(msg, m.Stop) and sim.stop_at is None:
                    sim.stop_at = time.monotonic()
        now = time.monotonic()
        if go_count == len(sims):
            for sim in sims:
                if sim.silent or sim.stop_at is not None:
                    continue
                if (
                    sim.member == silent_member
                    and sim.go_at
                    and now - sim.go_at > silence_after
                    and sim.last_beat
                ):
                    sim.silent, silenced_at = True, sim.last_beat
                    continue
                if now >= sim.next_beat:
                    try:
                        sim.sock.send(beats[sim.beats % len(beats)])
                        sim.beats += 1
                    except OSError:
                        pass
                    sim.last_beat, sim.next_beat = now, sim.next_beat + interval
    print(
        json.dumps(
            {
                "first_connect": first_connect,
                "hello": [s.hello_at for s in sims],
                "go": [s.go_at for s in sims],
                "stop": [s.stop_at for s in sims],
                "silenced_at": silenced_at,
            }
        ),
        flush=True,
    )


def scraper(port: int, every: float, until: float) -> tuple[int, float, int]:
    """Prometheus' part: GET /metrics every `every` s until `until`; (scrapes, the slowest in
    s, the last one's bytes)."""
    import urllib.request

    count, slowest, size = 0, 0.0, 0
    while time.monotonic() < until:
        began = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            size = len(response.read())
        slowest = max(slowest, time.monotonic() - began)
        count += 1
        time.sleep(max(0.0, every - (time.monotonic() - began)))
    return count, slowest, size


def once(n: int, workers: int, steady: float, scrape: float) -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    settle = 3.0
    zero = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--role",
            "node0",
            "--nodes",
            str(n),
            "--steady",
            str(steady),
            "--scrape",
            str(scrape),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    info = json.loads(zero.stdout.readline())
    interval = info["interval"]
    share = [list(range(n))[w::workers] for w in range(workers)]
    silent = n - 1
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--role",
                "nodes",
                "--nodes",
                str(n),
                "--port",
                str(info["port"]),
                "--members",
                ",".join(map(str, members)),
                "--interval",
                str(interval),
                "--silent",
                str(silent),
                "--silence-after",
                str(settle + steady + 1),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for members in share
        if members
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        scrapes = (0, 0.0, 0)
        if info["metrics"]:
            # The steady window starts `settle` s after the last go (about a second from now).
            scrapes = scraper(info["metrics"], scrape, time.monotonic() + settle + steady + 1)
        results = [json.loads(proc.stdout.readline()) for proc in procs]
        cpu = json.loads(zero.stdout.readline())["cpu_per_s"]
    finally:
        for proc in [*procs, zero]:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    hellos = [t for r in results for t in r["hello"]]
    gos = [t for r in results for t in r["go"]]
    stops = [t for r in results for t in r["stop"] if t is not None]
    silenced = next(r["silenced_at"] for r in results if r["silenced_at"] is not None)
    return {
        "join": max(gos) - max(hellos),
        "all": max(gos) - min(r["first_connect"] for r in results),
        "cpu": cpu,
        "detect": min(stops) - silenced,
        "detect_all": max(stops) - silenced,
        "interval": interval,
        "timeout": info["timeout"],
        "hello_kb": None,
        "scrapes": scrapes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="64,256,1024", help="node counts (%(default)s)")
    parser.add_argument(
        "--steady",
        type=float,
        default=20,
        help="seconds of steady beats over which node 0's CPU is measured (%(default)s)",
    )
    parser.add_argument("--workers", type=int, default=4, help="processes simulating nodes")
    parser.add_argument(
        "--scrape", type=float, default=15, help="seconds between scrapes of /metrics; 0: none"
    )
    parser.add_argument("--role", default="main", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--members", help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--silent", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--silence-after", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "node0":
        node0(int(args.nodes), args.steady, 3.0, args.scrape)
        return
    if args.role == "nodes":
        nodes(
            [int(x) for x in args.members.split(",")],
            int(args.nodes),
            args.port,
            args.interval,
            args.silent,
            args.silence_after,
        )
        return
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    print(
        f"control plane, simulated nodes on loopback ({cores} CPU cores, load {load:.1f} at "
        f"the start; {args.workers} processes simulate the nodes)"
    )
    print(
        f"{'nodes':>6} {'last hello->go':>15} {'connect->go':>12} {'node 0 CPU':>11} "
        f"{'detection':>10}  (interval, timeout)  scrapes: count, slowest, size"
    )
    for n in (int(x) for x in args.nodes.split(",")):
        r = once(n, args.workers, args.steady, args.scrape)
        count, slowest, size = r["scrapes"]
        print(
            f"{n:>6} {r['join']:>13.2f} s {r['all']:>10.2f} s {r['cpu'] * 100:>9.1f} % "
            f"{r['detect']:>8.1f} s  ({r['interval']:g} s, {r['timeout']:g} s)  "
            + (f"{count}, {slowest * 1000:.0f} ms, {size / 1024:.0f} KiB" if count else "none"),
            flush=True,
        )


if __name__ == "__main__":
    main()
