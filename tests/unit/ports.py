"""Ports for the real nodes the unit tests start on loopback: below the kernel's ephemeral range,
as the benchmarks' (benchmarks/loopback.py)."""

from benchmarks.loopback import free_ports

__all__ = ["free_ports"]
