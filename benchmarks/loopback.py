"""Ports for the nodes the benchmarks and the unit tests (tests/unit/ports.py) start on loopback."""

import random
import socket
from pathlib import Path


def free_ports(count: int = 1) -> int:
    """The first of `count` consecutive ports free on loopback, below the kernel's ephemeral
    range (ip_local_port_range), from which it hands out outgoing connections' own ends: a port
    picked inside it can be taken by one between the pick and the node's bind. Seen beside
    stress-ng with 3 test processes, as "ENTRYPOINT_CONTROL_PORT=...: cannot listen on node 0",
    and as a node 1 that waited for a node 0 that never listened."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(1024, low - count)
        try:
            for each in range(port, port + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", each))
            return port
        except OSError:
            continue
