"""Node 0's seat on a real etcd at fleet scale (issue 50, item 8): what etcd costs while node 0
keeps its lease, and how long the survivors of a node 0 loss take to agree on the next one.

A real etcd (Debian's etcd-server) on loopback, started here. Node 0 takes its seat and keeps
its lease with the entrypoint's own code (entrypoint.consensus: LeaseKeeper, campaign). Then
for each size, that many survivors (asyncio connections on loopback, as many as the nodes) each
open a watch of the seat, as a node that lost node 0 does; node 0's lease ends (revoked, as etcd
does when its TTL runs out); each survivor that sees the seat free campaigns for it in one
transaction and reads who holds it. Prints figures; asserts nothing.

    python benchmarks/node0_seat.py [--nodes 1024,4096] [--steady 20]

Figures:
- steady: etcd's CPU per second while node 0 renews its lease (no other traffic: beats never
  touch etcd);
- loss: from the lease's end to the first survivor holding the seat, and to every survivor
  knowing the holder; the requests it took; etcd's CPU seconds for it. Add the lease's TTL
  (8 s) for a node 0 that went silent (cut off, paused);
- the same from node 0's hang-up (its process ended, every survivor's connection closed): each
  survivor says so in etcd, the lowest reads their count every 0.1 s and ends node 0's lease.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.loopback import free_ports  # noqa: E402
from entrypoint.consensus.election import Holder, campaign, hangups_key, seat_key  # noqa: E402
from entrypoint.consensus.etcd import Etcd, range_end  # noqa: E402
from entrypoint.consensus.lease import RENEWALS, TTL, LeaseKeeper  # noqa: E402
from entrypoint.supervise.takeover import HANGUP_POLL  # noqa: E402


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_etcd(data: Path) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("etcd")
    if not binary:
        sys.exit("etcd is not installed: apt-get install etcd-server")
    port = free_ports(2)
    client, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    proc = subprocess.Popen(
        [binary, "--name", "b", "--data-dir", str(data), "--listen-client-urls", client,
         "--advertise-client-urls", client, "--listen-peer-urls", peer,
         "--initial-advertise-peer-urls", peer, "--initial-cluster", f"b={peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    etcd = Etcd([("127.0.0.1", port)])
    deadline = time.monotonic() + 30
    while True:
        try:
            etcd.get("/ready")
            return proc, port
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                sys.exit("etcd did not start")
            time.sleep(0.1)


async def post(port: int, path: str, body: dict) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(
        f"POST /v3/{path} HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    raw = await reader.read()
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        rest = dechunk(rest)
    return json.loads(rest)


def dechunk(data: bytes) -> bytes:
    out, i = b"", 0
    while True:
        end = data.index(b"\r\n", i)
        size = int(data[i:end], 16)
        if size == 0:
            return out
        out += data[end + 2 : end + 2 + size]
        i = end + 2 + size + 2


async def say_hung_up(port: int, job: str, member: int, term: int, stats: dict) -> None:
    """As a survivor that node 0 hung up on: say so (election.hang_up)."""
    await post(port, "kv/put", {"key": b64(f"{hangups_key(job, term)}{member}"), "value": ""})
    stats["requests"] += 1


async def decide(port: int, job: str, term: int, nodes: int, lease: int, stats: dict) -> None:
    """As the lowest survivor: once every survivor has said node 0 hung up, end its lease
    (election.depose), reading the others' word every HANGUP_POLL."""
    prefix = hangups_key(job, term)
    end = base64.b64encode(range_end(prefix)).decode()
    while True:
        answer = await post(port, "kv/range", {
            "key": b64(prefix), "range_end": end, "count_only": True,
        })  # fmt: skip
        stats["requests"] += 1
        if int(answer.get("count", 0)) >= nodes - 1:
            break
        await asyncio.sleep(HANGUP_POLL)
    await post(port, "lease/revoke", {"ID": str(lease)})
    stats["requests"] += 1


async def survivor(port: int, job: str, member: int, since: int, stats: dict) -> None:
    """Watch the seat until it is free, campaign for it, know its holder (the winner's
    transaction answers with the holder; a loser's too)."""
    key = b64(seat_key(job))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    body = json.dumps({"create_request": {"key": key, "start_revision": str(since)}}).encode()
    writer.write(
        f"POST /v3/watch HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    stats["watching"] += 1
    buffer = b""
    while True:
        line = await reader.readline()
        if not line:
            break
        buffer += line
        if b'"DELETE"' in buffer:
            break
        if line == b"\r\n":
            buffer = b""
    writer.close()
    record = json.dumps({"member": member, "host": f"node-{member}", "address": "x:1"})
    put = {"key": key, "value": b64(record)}
    answer = await post(port, "kv/txn", {
        "compare": [{"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
        "success": [{"request_put": put}, {"request_range": {"key": key}}],
        "failure": [{"request_range": {"key": key}}],
    })  # fmt: skip
    now = time.monotonic()
    stats["requests"] += 2
    if answer.get("succeeded"):
        stats["first"] = now
    kvs = [r["response_range"] for r in answer["responses"] if "response_range" in r][-1]["kvs"]
    stats["holders"].add(json.loads(base64.b64decode(kvs[0]["value"]))["member"])
    stats["last"] = now


async def loss(port: int, nodes: int, job: str, etcd_pid: int, hung_up: bool) -> dict:
    etcd = Etcd([("127.0.0.1", port)])
    keeper = LeaseKeeper.grant(etcd, TTL, lambda why: None)
    seat = campaign(etcd, job, Holder(0, "node-0", "x:1"), keeper.lease)
    value = etcd.get(seat_key(job))
    assert value is not None and seat.member == 0
    stats: dict = {"watching": 0, "requests": 0, "holders": set(), "first": None, "last": None}
    tasks = [
        asyncio.create_task(survivor(port, job, member, value.modified + 1, stats))
        for member in range(1, nodes)
    ]
    while stats["watching"] < nodes - 1:
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # every watch created inside etcd
    cpu = cpu_seconds(etcd_pid)
    ended = time.monotonic()
    if hung_up:  # node 0's process ended: every survivor says so, the lowest ends its lease
        await asyncio.to_thread(keeper.stop)
        ended = time.monotonic()
        said = [say_hung_up(port, job, m, seat.term, stats) for m in range(1, nodes)]
        await asyncio.gather(*said, decide(port, job, seat.term, nodes, keeper.lease, stats))
    else:  # node 0's lease ends: its seat is free
        await asyncio.to_thread(keeper.stop, True)
    await asyncio.gather(*tasks)
    stats["cpu"] = cpu_seconds(etcd_pid) - cpu
    stats["first"] -= ended
    stats["last"] -= ended
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1024,4096")
    parser.add_argument("--steady", type=float, default=20.0)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as data:
        proc, port = start_etcd(Path(data))
        try:
            etcd = Etcd([("127.0.0.1", port)])
            keeper = LeaseKeeper.grant(etcd, TTL, lambda why: None)
            before, started = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(args.steady)
            share = (cpu_seconds(proc.pid) - before) / (time.monotonic() - started)
            keeper.stop(revoke=True)
            print(f"steady: node 0 renewing its {TTL} s lease every {TTL / RENEWALS:.2f} s: etcd "
                  f"{100 * share:.2f}% of one core over {args.steady:g} s")  # fmt: skip
            print(f"{'nodes':>6} {'loss':>8} {'loss->first holder':>19} "
                  f"{'loss->all know it':>18} {'requests':>9} {'etcd CPU s':>10} "
                  f"{'holders':>8}")  # fmt: skip
            for nodes in (int(x) for x in args.nodes.split(",")):
                for hung_up in (False, True):
                    job = f"bench-{nodes}-{int(hung_up)}"
                    got = asyncio.run(loss(port, nodes, job, proc.pid, hung_up))
                    holders = len(got["holders"])
                    how = "hang-up" if hung_up else "lease"
                    print(f"{nodes:>6} {how:>8} {got['first']:>17.2f} s {got['last']:>16.2f} s "
                          f"{got['requests']:>9} {got['cpu']:>10.2f} {holders:>8}")  # fmt: skip
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
