"""Hardware and network facts about this node: plain values, gathered by entrypoint.supervise.probe.

Tests build these by hand; nothing here touches the machine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str = ""
    name: str = ""
    memory_mib: int = 0


@dataclass(frozen=True)
class Interface:
    name: str
    address: str  # IPv4, or "" when it has none
    ipv6: tuple[str, ...] = ()  # its IPv6 addresses, link-local ones included


@dataclass(frozen=True)
class Facts:
    hostname: str = "localhost"
    python: str = "python3"
    cpu_count: int = 1
    # None: the GPUs were not probed, because the count was stated (plan never needs a probe
    # for what the user or platform stated; run checks the statement against a probe).
    gpus: tuple[Gpu, ...] | None = None
    gpu_probe: str = "not probed"
    interfaces: tuple[Interface, ...] = ()
    # The interface whose address this node uses to reach the master, and the default route's.
    route_to_master: str | None = None
    default_route: str | None = None
    # The master's name resolved (IPv4 or IPv6, the first the resolver gives); None when it
    # did not resolve.
    master_ip: str | None = None
    # Seconds after the first probe at which a name that did not resolve then resolved.
    master_resolved_after: float | None = None
    ib_hcas: tuple[str, ...] = ()
    # The text of the config file a user's `accelerate launch --config_file F` line names
    # (plan.launch_lines); None when there is none or it cannot be read here.
    launch_config: str | None = None


# Interfaces NCCL and gloo must not use for traffic between nodes.
_LOCAL_ONLY_PREFIXES = ("lo", "docker", "br-", "veth", "virbr", "cni-podman")


def is_local_only(interface: str) -> bool:
    return interface.startswith(_LOCAL_ONLY_PREFIXES)
