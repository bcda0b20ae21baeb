"""Ports for the nodes the benchmarks and the unit tests (tests/unit/ports.py) start on loopback."""

import os
import random
import socket
from pathlib import Path

SLICES = 16  # the range cut in as many: one for each pytest-xdist worker, the last for the rest


def _slice(first: int, end: int) -> tuple[int, int]:
    """This process's share of [first, end): pytest-xdist's worker gwN takes slice N (mod 15),
    any other process (SERIAL's pytest beside them, a benchmark) the last one. A window picked
    free is free only until its nodes bind it, and a trainer binds its port seconds later, after
    a restart again: picked from one range, another worker's test took such a port in between
    (2026-12-07: "Address already in use" from a restarted rank 0 in CI)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % (SLICES - 1) if worker[2:].isdigit() else SLICES - 1
    size = (end - first) // SLICES
    return first + index * size, first + (index + 1) * size


def free_ports(count: int = 1) -> int:
    """The first of `count` consecutive ports free on loopback, below the kernel's ephemeral
    range (ip_local_port_range), from which it hands out outgoing connections' own ends: a port
    picked inside it can be taken by one between the pick and the node's bind. Seen beside
    stress-ng with 3 test processes, as "ENTRYPOINT_CONTROL_PORT=...: cannot listen on node 0",
    and as a node 1 that waited for a node 0 that never listened."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first, last = _slice(1024, low)
    while True:
        port = random.randrange(first, last - count)
        try:
            for each in range(port, port + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", each))
            return port
        except OSError:
            continue
