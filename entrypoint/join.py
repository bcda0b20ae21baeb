"""The join's parts: the job's identity, node 0's control server, each member's hello."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping

from entrypoint import control, control_server, fingerprint, sockets
from entrypoint.conductor import Conductor
from entrypoint.conductor_terms import Limits
from entrypoint.identity import TOKEN_VARIABLE, Identity, job_identity, read_token
from entrypoint.plan import Plan
from entrypoint.settings import Settings
from entrypoint.values import host_port

# A crash breaks its peers' collectives a moment later: node 0 waits this long for every
# node's report before it names the first failure as the cause.
FAILURE_WINDOW = 3.0


def identity(env: Mapping[str, str], plan: Plan, settings: Settings) -> Identity:
    """The job's identity the handshake proves: its id, and ENTRYPOINT_JOB_TOKEN when set."""
    token = settings.job_token.get_secret_value() if settings.job_token else None
    return Identity(
        job_identity(env, plan.platform, settings.job_id),
        read_token(token, settings.job_token_file),
    )


def without_token(env: Mapping[str, str]) -> dict[str, str]:
    """The environment less the job's token, which only the entrypoints need."""
    return {k: v for k, v in env.items() if k != TOKEN_VARIABLE}


def serve(
    plan: Plan,
    settings: Settings,
    expected: int,
    unit: str,
    log: Callable[[str, str], None],
    identity: Identity,
) -> tuple[control_server.Server, str, int | None]:
    """Node 0: start the control server; it, and the address every member connects to."""
    s = settings
    host, port = plan.master_addr, plan.control_port
    limits = Limits(
        join_timeout=s.join_timeout,
        heartbeat_timeout=s.heartbeat_timeout,
        max_restarts=s.max_restarts,
        max_clock_skew=s.max_clock_skew,
        monitor_interval=s.monitor_interval,
        failure_window=FAILURE_WINDOW if expected > 1 else 0.0,
    )
    bind = sockets.ANY if expected > 1 else "127.0.0.1"  # both families; one node: loopback
    conductor = Conductor(
        expected,
        limits,
        time.monotonic(),
        unit=unit,
        address=host_port(host, port or "auto"),
    )
    server = control_server.Server(
        conductor,
        port or 0,
        heartbeat_interval=s.heartbeat_interval,
        log=log,
        bind=bind,
        identity=identity,
    )
    server.start()
    if port is None:
        host, port = "127.0.0.1", server.port
    return server, host, port


def collect_fingerprint(plan: Plan, settings: Settings) -> dict:
    """This node's fingerprint, as node 0 compares it: hardware, software, data, the plan's
    layout."""
    fp = fingerprint.collect(
        gpus_per_node=plan.gpus_per_node, gpu_names=plan.gpu_names, data_dir=settings.data_dir
    )
    fp["layout"] = fingerprint.layout(plan)
    return fp


def hello(plan: Plan, member: int | None, generation: int, fp: dict) -> dict:
    """This member's hello to node 0: who it is, its start, its clock and its fingerprint."""
    return {
        "t": "hello",
        "protocol": control.PROTOCOL,
        "member": member,
        "node_rank": plan.node_rank,
        "host": socket.gethostname(),
        "generation": generation,
        "time": time.time(),
        "fingerprint": fp,
    }
