"""The join's two ends: node 0's control server, and the hello every member sends it."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from entrypoint import control, fingerprint
from entrypoint.conductor import Conductor, Limits
from entrypoint.plan import Plan
from entrypoint.settings import Settings

# A crash breaks its peers' collectives a moment later: node 0 waits this long for every
# node's report before it names the first failure as the cause.
FAILURE_WINDOW = 3.0


def serve(plan: Plan, settings: Settings, expected: int, unit: str,
          log: Callable[[str, str], None]) -> tuple[control.Server, str, int | None]:
    """Node 0: start the control server; it, and the address every member connects to."""
    s = settings
    host, port = plan.master_addr, plan.control_port
    limits = Limits(join_timeout=s.join_timeout, heartbeat_timeout=s.heartbeat_timeout,
                    max_restarts=s.max_restarts, max_clock_skew=s.max_clock_skew,
                    monitor_interval=s.monitor_interval,
                    failure_window=FAILURE_WINDOW if expected > 1 else 0.0)
    bind = "0.0.0.0" if expected > 1 else "127.0.0.1"
    conductor = Conductor(expected, limits, time.monotonic(), unit=unit,
                          address=f"{host}:{port or 'auto'}")
    server = control.Server(conductor, port or 0, heartbeat_interval=s.heartbeat_interval,
                            log=log, bind=bind)
    server.start()
    if port is None:
        host, port = "127.0.0.1", server.port
    return server, host, port


def hello(plan: Plan, settings: Settings, member: int | None, generation: int) -> dict:
    """This member's hello to node 0: who it is, its start, its clock and its fingerprint."""
    fp = fingerprint.collect(gpus_per_node=plan.gpus_per_node, gpu_names=plan.gpu_names,
                             data_dir=settings.data_dir)
    fp["layout"] = (f"{plan.nnodes} nodes x {plan.nproc_per_node} workers, "
                    f"master {plan.master_addr}")
    return {"t": "hello", "protocol": control.PROTOCOL, "member": member,
            "node_rank": plan.node_rank, "host": socket.gethostname(),
            "generation": generation, "time": time.time(), "fingerprint": fp}
