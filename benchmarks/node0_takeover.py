"""Node 0 lost at fleet scale (issue 50, item 8): the whole takeover, with the entrypoint's own
parts, at 1,024 and 4,096 simulated nodes on this machine.

A real etcd (Debian's etcd-server) on loopback, started here (benchmarks/node0_seat.py's). Node
0 is its own process: the real control Server and Conductor, with its seat in etcd and the
job's record written there after every tick (supervise/takeover.py: Node0Seat, Recorder), as
a job with a job's own etcd or ENTRYPOINT_ETCD runs it. The simulated nodes are a few processes
driving their share over real sockets on loopback (benchmarks/control_scale.py's handshake and
heartbeats). Node 1's entrypoint is its own process too (the survivor). After a steady window,
node 0's process is SIGKILLed: the survivor takes over with the entrypoint's own code
(Node0Seat.take_over: the record read, the wait for the old lease to end, the campaign; then
the job resumed from the record, a new Server), and every simulated node joins it again once
the survivor listens, as a node does that reads the new holder from etcd (the election among
every survivor at these sizes: benchmarks/node0_seat.py). Prints figures; asserts nothing.

    python benchmarks/node0_takeover.py [--nodes 1024,4096] [--steady 20] [--workers 4]

Figures:
- steady: node 0's CPU share (its Server, Conductor and record writes) and etcd's, per second;
  the record's size;
- takeover: from node 0's kill to the survivor holding the seat (most of it the old lease's
  TTL, which a dead node 0 cannot revoke), to its Server listening, and to the last node's
  `go` from it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.control_scale import GPUS, Sim, hello, sim_fingerprint  # noqa: E402
from benchmarks.node0_seat import cpu_seconds, start_etcd  # noqa: E402

JOB = "bench-takeover"
LOOPBACK = "127.0.0.1"


def _limits(n: int):
    from entrypoint.coordinator.state import Limits
    from entrypoint.plan.settings import Settings

    s = Settings.from_env({})
    return s, Limits(join_timeout=300, heartbeat_timeout=s.heartbeat_timeout, monitor_interval=0)


def _roster(n: int):
    from entrypoint.coordinator.roster import Roster

    return Roster(members=n, full=n, min_nodes=n - 1)  # no spare: the job shrinks by node 0


def _serve(mind, interval: float):
    from entrypoint.control import control_server

    server = control_server.Server(
        mind, 0, heartbeat_interval=interval, log=lambda level, text: None, bind=LOOPBACK
    )
    server.start()
    return server


def node0(n: int, etcd_port: int, steady: float) -> None:
    """Node 0's process: its seat, its record in etcd, the real Server; its CPU share over the
    steady window; then it runs until it is killed."""
    from entrypoint.consensus.election import Holder
    from entrypoint.consensus.etcd import Etcd
    from entrypoint.coordinator.conductor import Conductor
    from entrypoint.supervise.takeover import Node0Seat

    settings, limits = _limits(n)
    conductor = Conductor(n, limits, time.monotonic(), address="bench", roster=_roster(n))
    seat = Node0Seat(Etcd([(LOOPBACK, etcd_port)]), JOB, fence=lambda why: print(why, flush=True))
    server = _serve(seat.recorder("digest")(conductor), settings.heartbeat_interval)
    assert seat.hold(Holder(0, "node-0", f"{LOOPBACK}:{server.port}")) is not None
    print(json.dumps({"port": server.port, "interval": settings.heartbeat_interval}), flush=True)
    while conductor.job.phase == "join":
        time.sleep(0.01)
    time.sleep(3)
    before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.monotonic()
    time.sleep(steady)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"cpu_per_s": cpu / (time.monotonic() - began)}), flush=True)
    time.sleep(3600)


def survivor(n: int, etcd_port: int) -> None:
    """Node 1's entrypoint once node 0 is lost (a line on stdin): the entrypoint's takeover,
    then the job resumed from the record on a Server of its own."""
    from entrypoint.consensus.election import Holder
    from entrypoint.consensus.etcd import Etcd
    from entrypoint.coordinator.conductor import Conductor
    from entrypoint.coordinator.job_record import resumed
    from entrypoint.supervise.node_exits import Node0Lost
    from entrypoint.supervise.takeover import Node0Seat

    settings, limits = _limits(n)
    seat = Node0Seat(Etcd([(LOOPBACK, etcd_port)]), JOB, fence=lambda why: print(why, flush=True))
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.monotonic()
    lost = Node0Lost(75, "node 0 (node-0) lost: its connection closed")
    me = Holder(1, "node-1", f"{LOOPBACK}:0")
    won = seat.take_over(lost, me, _roster(n), 0)
    seated = time.monotonic()
    assert won.keeper is not None, won.holder
    job = resumed(
        won.record,
        1,
        won.alive,
        expected=n,
        limits=limits,
        roster=_roster(n),
        now=time.monotonic(),
        address="bench",
        why=lost.reason,
    )
    server = _serve(seat.recorder("digest")(Conductor.resume(job)), settings.heartbeat_interval)
    listening = time.monotonic()
    print(
        json.dumps(
            {
                "port": server.port,
                "seated": seated - began,
                "listening": listening - began,
                "record_kb": len(won.record.to_json()) / 1024,
            }
        ),
        flush=True,
    )
    time.sleep(3600)


def nodes(members: list[int], n: int, port: int, interval: float) -> None:
    """A worker process driving `members` (node 0's own entrypoint among them): join node 0 and
    beat; when node 0's connection closes, wait for the new node 0's port (a line on stdin),
    join it and beat."""
    from entrypoint.control import control_channel
    from entrypoint.control import messages as m
    from entrypoint.control.node_stats import NodeStats

    fp = sim_fingerprint()
    beats = [m.encode(m.Beat(NodeStats.from_wire({"gpus": GPUS})))] + [m.encode(m.Beat())] * 9
    print("ready", flush=True)
    goes: dict[int, list[float]] = {0: [], 1: []}
    for generation in (0, 1):
        if generation == 1:
            port = int(sys.stdin.readline())
        sel = selectors.DefaultSelector()
        sims = [Sim(i) for i in members if generation == 0 or i != 0]  # node 0's own: gone
        for sim in sims:
            sim.sock = socket.create_connection((LOOPBACK, port), timeout=60)
            sim.channel = control_channel.Channel(sim.sock, "bench")
            sel.register(sim.sock, selectors.EVENT_READ, sim)
        closed = 0
        deadline = time.monotonic() + 900
        while closed < len(sims) and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.05):
                sim = key.data
                try:
                    data = sim.sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(sim.sock)
                    sim.sock.close()
                    closed += 1
                    continue
                for line in sim.channel.lines.feed(data):
                    msg = m.decode(line, m.FROM_NODE_0)
                    if isinstance(msg, m.Challenge):
                        sim.channel.challenge = msg
                        sim.channel.send(hello(sim.member, n, fp, generation))
                        sim.sock.setblocking(False)
                    elif isinstance(msg, m.Go) and sim.go_at is None:
                        sim.go_at = time.monotonic()
                        sim.next_beat = sim.go_at
                        goes[generation].append(time.time())
            if generation == 1 and len(goes[1]) == len(sims):
                break  # every node goes again: the measure is taken
            now = time.monotonic()
            for sim in sims:
                if sim.go_at is not None and now >= sim.next_beat:
                    try:
                        sim.sock.send(beats[sim.beats % len(beats)])
                        sim.beats += 1
                    except OSError:
                        pass
                    sim.next_beat += interval
        print(json.dumps({"generation": generation, "goes": len(goes[generation])}), flush=True)
    print(json.dumps({"last_go": max(goes[1], default=None)}), flush=True)


def _spawn(*args: str, stdin: bool = False) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def once(n: int, workers: int, steady: float) -> dict:
    with tempfile.TemporaryDirectory() as data:
        etcd, etcd_port = start_etcd(Path(data))
        procs: list[subprocess.Popen[str]] = []
        try:
            zero = _spawn("--role", "node0", "--nodes", str(n), "--etcd", str(etcd_port),
                          "--steady", str(steady))  # fmt: skip
            procs.append(zero)
            info = json.loads(zero.stdout.readline())
            one = _spawn("--role", "survivor", "--nodes", str(n), "--etcd", str(etcd_port),
                         stdin=True)  # fmt: skip
            procs.append(one)
            assert one.stdout.readline().strip() == "ready"
            members = list(range(n))  # node 0's own entrypoint joins its Server too
            sims = [
                _spawn(
                    "--role",
                    "nodes",
                    "--nodes",
                    str(n),
                    "--port",
                    str(info["port"]),
                    "--members",
                    ",".join(map(str, members[w::workers])),
                    "--interval",
                    str(info["interval"]),
                    stdin=True,
                )  # fmt: skip
                for w in range(workers)
                if members[w::workers]
            ]
            procs += sims
            for proc in sims:
                assert proc.stdout.readline().strip() == "ready"
            etcd_before, etcd_at = cpu_seconds(etcd.pid), time.monotonic()
            cpu = json.loads(zero.stdout.readline())["cpu_per_s"]  # after the steady window
            etcd_cpu = (cpu_seconds(etcd.pid) - etcd_before) / (time.monotonic() - etcd_at)
            killed = time.time()
            zero.send_signal(signal.SIGKILL)
            one.stdin.write("lost\n")
            one.stdin.flush()
            for proc in sims:
                assert json.loads(proc.stdout.readline())["generation"] == 0
            took = json.loads(one.stdout.readline())
            for proc in sims:
                proc.stdin.write(f"{took['port']}\n")
                proc.stdin.flush()
            last = []
            for proc in sims:
                proc.stdout.readline()  # generation 1's count
                last.append(json.loads(proc.stdout.readline())["last_go"])
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
            etcd.terminate()
            etcd.wait()
    return {
        "cpu": cpu,
        "etcd_cpu": etcd_cpu,
        "seated": took["seated"],
        "listening": took["listening"],
        "go": max(last) - killed,
        "record_kb": took["record_kb"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="1024,4096", help="node counts (%(default)s)")
    parser.add_argument("--steady", type=float, default=20, help="seconds (%(default)s)")
    parser.add_argument("--workers", type=int, default=4, help="processes simulating nodes")
    parser.add_argument("--role", default="main", help=argparse.SUPPRESS)
    parser.add_argument("--etcd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--members", help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "node0":
        return node0(int(args.nodes), args.etcd, args.steady)
    if args.role == "survivor":
        return survivor(int(args.nodes), args.etcd)
    if args.role == "nodes":
        members = [int(x) for x in args.members.split(",")]
        return nodes(members, int(args.nodes), args.port, args.interval)
    from entrypoint.consensus.lease import TTL

    cores = len(os.sched_getaffinity(0))
    print(
        f"node 0 lost, simulated nodes on loopback ({cores} CPU cores, load "
        f"{os.getloadavg()[0]:.1f} at the start; a real etcd; node 0's lease TTL {TTL} s)"
    )
    print(
        f"{'nodes':>6} {'node 0 CPU':>11} {'etcd CPU':>9} {'record':>8} "
        f"{'kill->seat':>11} {'->listening':>12} {'kill->last go':>14}"
    )
    for n in (int(x) for x in args.nodes.split(",")):
        r = once(n, args.workers, args.steady)
        print(
            f"{n:>6} {r['cpu'] * 100:>9.1f} % {r['etcd_cpu'] * 100:>7.1f} % "
            f"{r['record_kb']:>5.0f} KiB {r['seated']:>9.2f} s {r['listening']:>10.2f} s "
            f"{r['go']:>12.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
