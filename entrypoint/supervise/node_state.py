"""What a node's join (entrypoint.supervise.join's `Join`) and its supervising loop
(entrypoint.supervise.supervisor) share: one record, `NodeState`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from entrypoint.control import control_channel, control_server
from entrypoint.control.actions import Mind
from entrypoint.control.identity import Identity
from entrypoint.coordinator.conductor import Conductor
from entrypoint.plan.node_plan import Plan
from entrypoint.plan.settings import Settings
from entrypoint.supervise.worker_signals import SignalRelay

if TYPE_CHECKING:
    from entrypoint.supervise.logs import Logger


# Node 0 seated this node anew (node rank, nnodes; and the host of a new node 0 after a
# takeover, or None): the plan for that seat and the trainer's environment with it
# (entrypoint.supervise.node).
Replan = Callable[[int, int, str | None], tuple[Plan, dict[str, str]]]


@dataclass
class NodeState:
    """What a node's join (`Join`) and its supervising loop (entrypoint.supervise.supervisor)
    share: the plan it trains with, who it is in the job, this start's generation, the signals
    it received, and its ends of the control channel."""

    plan: Plan
    settings: Settings
    log: Logger  # the node's structlog logger (entrypoint.supervise.logs.setup)
    env: dict[str, str]  # the trainer's environment, less the job's token
    identity: Identity
    member: int  # this member's id in the job (node 0 is 0)
    expected: int  # the members the platform started, spares included
    unit: str  # "node", or "process" when the platform started one per GPU
    signals: SignalRelay
    replan: Replan | None = None
    generation: int = 0  # this start: 0, then one more at every restart
    standing_by: bool = False  # a spare: no trainer until node 0 seats it
    # A stopping signal this node received, or that node 0 passed on: the job is ending and no
    # restart may start it again.
    stop_signal: int | None = None
    server: control_server.Server | None = None  # node 0's control server, on node 0
    # What node 0 does when its control server fails, before its connections close
    server_failed: Callable[[], None] | None = None
    channel: control_channel.Channel | None = None  # this node's channel to node 0
    connecting: bool = False  # in a blocking connect, which a stopping signal ends at once
    # The member serving the job (node 0): 0, or node 0's seat holder in etcd after a takeover,
    # and then its host, where the trainer's rendezvous moves (supervise/takeover.py).
    head: int = 0
    master: str | None = None
    # Node 0's Conductor as its control server sees it, when etcd keeps the job's record.
    recorded: Callable[[Conductor], Mind] | None = None
    # The job's own etcd (consensus/embedded.py): how many members node 0 has run one (0: none),
    # and what this node does with node 0's choice of them, in the first `go` that names them.
    etcd_members: int = 0
    on_etcd: Callable[[tuple[str, ...]], None] | None = None
