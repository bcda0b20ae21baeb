"""The join's parts: the job's identity, node 0's control server, each member's hello, and
`Join`, a node's side of the join. The Supervisor holds it, and both read and change the node's
`NodeState` (entrypoint.supervise.node_state); Join raises, and holds nothing of the Supervisor."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from entrypoint import STOPPING, signal_name
from entrypoint.control import control_channel, control_server, sockets
from entrypoint.control import messages as m
from entrypoint.control.actions import Mind
from entrypoint.control.identity import Identity, job_identity, read_token
from entrypoint.control.node_fingerprint import Fingerprint, PlannedShape
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.roster import Roster
from entrypoint.coordinator.state import Limits
from entrypoint.plan.errors import EXIT_PEERS
from entrypoint.plan.launchers import Launcher
from entrypoint.plan.node_plan import Plan
from entrypoint.plan.secrets import TOKEN_FILE_VARIABLE, TOKEN_VARIABLE
from entrypoint.plan.settings import Settings
from entrypoint.plan.values import host_port
from entrypoint.supervise import health, knock, probe
from entrypoint.supervise.gpu_stats import Stats
from entrypoint.supervise.node_exits import HeadElsewhere, Interrupted, Node0Lost, NodeExit
from entrypoint.supervise.node_state import NodeState

if TYPE_CHECKING:
    pass

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
    """The environment less the job's token and the name of its file, which only the
    entrypoints need."""
    return {k: v for k, v in env.items() if k not in (TOKEN_VARIABLE, TOKEN_FILE_VARIABLE)}


def limits_of(s: Settings, expected: int) -> Limits:
    """Node 0's Conductor's limits, from the settings."""
    return Limits(
        join_timeout=s.join_timeout,
        heartbeat_timeout=s.heartbeat_timeout,
        max_restarts=s.max_restarts,
        max_clock_skew=s.max_clock_skew,
        monitor_interval=s.monitor_interval,
        failure_window=FAILURE_WINDOW if expected > 1 else 0.0,
        slow_window=s.slow_node_window,
        hang_timeout=s.hang_timeout,
        collective_timeout=s.collective_timeout,
        heartbeat_interval=s.heartbeat_interval,
    )


def roster_of(plan: Plan, expected: int) -> Roster:
    """The job's members, how many train and the fewest it trains on (spares, a minimum)."""
    if not plan.spawn:
        return Roster(expected, expected, expected)
    return Roster(plan.members, plan.members - plan.spares, plan.min_nodes)


def serve(
    plan: Plan,
    settings: Settings,
    expected: int,
    unit: str,
    log: Callable[[str, str], None],
    identity: Identity,
    *,
    resumed: Conductor | None = None,
    recorded: Callable[[Conductor], Mind] | None = None,
    host: str | None = None,
    etcd_members: int = 0,
    failed: Callable[[], None] | None = None,
) -> tuple[control_server.Server, str, int | None]:
    """Node 0: start the control server; it, and the address every member connects to.
    `resumed`: a new node 0's Conductor, going on from the job's record (supervise/takeover.py)
    on `host`, this node; `recorded`: the Conductor as the server sees it, whose state is written
    to etcd (takeover.Recorder); `etcd_members`: how many members run the job's own etcd;
    `failed`: what this node does if the server fails (control_server.Server)."""
    s = settings
    host, port = host or plan.master_addr, plan.control_port
    limits = limits_of(s, expected)
    bind = sockets.ANY if expected > 1 else "127.0.0.1"  # both families; one node: loopback
    if plan.master_port and plan.spawn and plan.launcher is not Launcher.DIRECT:
        # Free now, what node 0's launcher will listen on (torchrun's store, JAX's coordinator):
        # held, torchrun fails only once every node joined. (A launcher's workers: its agent's.)
        var = plan.sources["master_port"].variable or "MASTER_PORT"
        fix = (
            f"Another process holds node 0's rendezvous port: stop it, or set {var} to a free port"
        )
        control_server.listen_or_say(bind, plan.master_port, var, fix).close()
    roster = roster_of(plan, expected)
    conductor = resumed or Conductor(
        expected,
        limits,
        time.monotonic(),
        unit=unit,
        address=host_port(host, port or "auto"),
        roster=roster,
        etcd_members=etcd_members,
    )
    server = control_server.Server(
        recorded(conductor) if recorded else conductor,
        port or 0,
        heartbeat_interval=s.heartbeat_interval,
        log=log,
        bind=bind,
        identity=identity,
        failed=failed,
    )
    server.start()
    if expected > 1 and not identity.token:
        log("warning", no_token_warning(server.port))
    if plan.metrics_port:
        try:
            from entrypoint.metrics import collector as metrics  # node 0 only: prometheus-client
        except ImportError as err:  # an image that dropped it: the job goes on without metrics
            log(
                "warning",
                f"no /metrics: {err}; install prometheus-client, or set ENTRYPOINT_METRICS_PORT=0",
            )
            return _started(server, host, port)
        name = identity.job.partition("=")[2] or "-"  # ENTRYPOINT_JOB_ID=train: train
        job = metrics.Job(name, plan.platform, plan.nproc_per_node)
        served = metrics.serve(conductor, job, plan.metrics_port, bind, log, server.clock.now)
        if served is not None:
            server.beside.append(served)
            where = host_port(host, plan.metrics_port)
            log("info", f"metrics of every node at http://{where}/metrics (entrypoint status)")
    return _started(server, host, port)


def no_token_warning(port: int) -> str:
    """Node 0's one line at start when the job has no token: what anyone can do, the fix."""
    return (
        f"no job token ({TOKEN_VARIABLE} or {TOKEN_FILE_VARIABLE} unset): anyone who can "
        f"reach node 0's control port {port} can join as a node and stop the job; set the "
        f"same {TOKEN_VARIABLE} on every node, e.g. "
        f"{TOKEN_VARIABLE}=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')"
    )


def _started(
    server: control_server.Server, host: str, port: int | None
) -> tuple[control_server.Server, str, int | None]:
    if port is None:
        host, port = "127.0.0.1", server.port
    return server, host, port


def layout(plan: Plan) -> PlannedShape:
    """This node's view of the job's shape (its plan), as node 0 compares it: as the platform
    counts its members (a spare's seat is node 0's to give)."""
    return PlannedShape(
        nnodes=plan.members,
        node_rank=plan.member,
        spares=plan.spares,
        min_nodes=plan.min_nodes,
        nproc_per_node=plan.nproc_per_node,
        world_size=plan.members * plan.nproc_per_node if plan.spawn else plan.world_size,
        master_addr=plan.master_addr,
        master_port=plan.master_port,
        launcher=plan.launcher,
    )


def collect_fingerprint(plan: Plan, settings: Settings, healthy: bool = True) -> Fingerprint:
    """This node's fingerprint, as node 0 compares it: hardware, software, data, the plan's
    layout. A node that failed its checks does not count its data (the directory may hang)."""
    fp = probe.fingerprint(
        gpus_per_node=plan.gpus_per_node,
        gpu_names=plan.gpu_names,
        data_dir=settings.data_dir if healthy else None,
    )
    return replace(fp, layout=layout(plan))


def hello(
    plan: Plan,
    member: int,
    generation: int,
    fp: Fingerprint,
    unhealthy: str = "",
    domain: str = "",
) -> m.Hello:
    """This member's hello to node 0: who it is, its start, its clock and its fingerprint, and
    the checks it failed before this start. The channel adds the job's identity and proof."""
    return m.Hello(
        member=member,
        host=socket.gethostname(),
        fingerprint=fp,
        time=time.time(),
        node_rank=plan.node_rank,
        generation=generation,
        unhealthy=unhealthy[:4000],
        domain=domain,
    )


class Join:
    """A node's join, the first time and at every restart: reach node 0 (serve it, on node 0), say
    hello, wait for `go` and the seat node 0 gives (entrypoint.coordinator.seating), or stand by.
    It owns the node's word with node 0 (`receive`, `check_node0`), and raises `Node0Lost` when
    node 0 is lost; the node's supervising loop, which holds it, ends its workers then."""

    def __init__(self, node: NodeState) -> None:
        self.node = node
        # the join in progress: node 0's address, when the join times out, this node's
        # fingerprint, and how many times node 0 closed the connection before its welcome
        self._node0_at: tuple[str, int] = ("", 0)
        self._join_deadline = 0.0
        self._fp = Fingerprint()
        self._rejoins = 0
        self._unhealthy = ""  # the checks this node failed before this start, one line
        self._domain = ""  # this node's NVLink domain (supervise/health.py), "" without one
        # node 0 started again after a takeover: its port, pointing at the seat's holder
        self.pointing: tuple[knock.Pointer, control_server.Server] | None = None

    @property
    def node0(self) -> control_channel.Channel:
        """The channel to node 0, which exists from the join on."""
        assert self.node.channel is not None, "no channel before the join"
        return self.node.channel

    def receive(self, timeout: float) -> list[m.Message]:
        """Node 0's messages within `timeout`; Node0Lost when its connection closed."""
        messages = self.node0.receive(timeout)
        if self.node0.closed:
            raise Node0Lost(
                EXIT_PEERS,
                f"lost node 0 ({self.node.plan.master_addr}): its connection "
                "closed (container killed, node crashed or rebooted)",
                hung_up=self.node0.hung_up,
            )
        return messages

    def check_node0(self, timeout: float) -> None:
        """Node0Lost when node 0 has been silent for more than `timeout` seconds."""
        silent = self.node0.silent()
        if silent > timeout:
            raise Node0Lost(
                EXIT_PEERS,
                f"node 0 ({self.node.plan.master_addr}) silent for {silent:.0f} s "
                f"(ENTRYPOINT_HEARTBEAT_TIMEOUT={timeout:g}): it hangs, is "
                "paused or this node is cut off from it",
            )

    def from_node0(self, reason: str) -> str:
        """A stop's reason as this node logs it (node 0 has logged its own already)."""
        return f"stopped by node 0: {reason}" if self.node.member != self.node.head else ""

    def server_log(self, level: str, text: str) -> None:
        # From the control server's thread: through the log writer's queue, never blocking.
        log = self.node.log
        if text.startswith("worker failed"):  # the failure summary, once, at node 0
            head, *lines = text.split("\n")
            log.error(head, traceback=[line.removeprefix("    ") for line in lines])
            return
        getattr(log, level)(text)

    @property
    def fingerprint(self) -> Fingerprint:
        """This node's fingerprint as its last hello gave it (empty before the first)."""
        return self._fp

    def start(self) -> None:
        """The first join: serve node 0 (on node 0), check this node, connect, hello, go. A node
        0 its platform started again, before its job formed, may hear at its own port from the
        node that took its seat (supervise/knock.py), and any node that joins node 0's address
        may be told there: it stops serving and joins that one, as the supervisor's
        `_find_head` does where etcd's endpoints are known. Node 0 then keeps its port pointing
        at the seat's holder (`pointing`), for the nodes started again after it."""
        try:
            self._start()
        except HeadElsewhere as found:
            how = (
                "it knocked at this node's control port"
                if self.node.server is not None
                else f"node 0's address {self.node.plan.master_addr} says so"
            )
            self.node.log.warning(
                f"node {found.member} ({found.host}) holds node 0's seat ({how}): this node, "
                "started again, joins it"
            )
            self._stop_serving()
            self.node.head, self.node.master = found.member, found.host
            self._start()
            plan = self.node.plan
            if self.node.member == 0 and plan.control_port:
                self.pointing = knock.pointing(
                    found.holds,
                    self.node.expected,
                    plan.control_port,
                    self.node.settings.heartbeat_interval,
                    self.server_log,
                    self.node.identity,
                )

    def _stop_serving(self) -> None:
        """Node 0's control server and /metrics stopped (their ports freed), its own
        connection closed."""
        server, self.node.server = self.node.server, None
        if server is not None:
            server.stop()
            server.finished.wait(timeout=2)
            for other in server.beside:
                other.join(timeout=2)  # its /metrics port free for the signpost
        if self.node.channel is not None:
            self.node.channel.close()

    def close(self) -> None:
        """At the node's end: the port that points at node 0, if this node serves one."""
        if self.pointing is not None:
            self.pointing[1].stop()

    def _start(self) -> None:
        host, port = self.node.plan.master_addr, self.node.plan.control_port
        if self.node.member != self.node.head and self.node.master is not None:
            host = self.node.master  # node 0 started again: a survivor holds its seat now
        elif self.node.member == 0:
            self.node.server, host, port = serve(
                self.node.plan,
                self.node.settings,
                self.node.expected,
                self.node.unit,
                self.server_log,
                self.node.identity,
                recorded=self.node.recorded,
                etcd_members=self.node.etcd_members,
                failed=self.node.server_failed,
            )
        if port is None:  # the plan leaves it open only for a single node, which serves it
            raise RuntimeError("no control port to connect to: node 0 did not serve one")
        # Collected before connecting: node 0 drops a connection silent for 30 s, and counting
        # a large data directory on a network filesystem can take longer.
        self._check_health(restart=False)
        self._fp = collect_fingerprint(self.node.plan, self.node.settings, not self._unhealthy)
        self._node0_at, self._rejoins = (host, port), 0
        self._join_deadline = time.monotonic() + self.node.settings.join_timeout
        self._connect()
        self.say_hello(self._fp)

    def rejoin(self, host: str, port: int) -> None:
        """Join a new node 0 at host:port (elected through etcd after node 0 was lost), as the
        first join did: connect, check this node, say hello, wait for `go` and the seat."""
        if self.node.channel is not None:
            self.node.channel.close()
        self._node0_at, self._rejoins = (host, port), 0
        self._join_deadline = time.monotonic() + self.node.settings.join_timeout
        self._connect()
        self.say_hello()

    def _connect(self) -> None:
        waiting = (
            "while waiting for node 0"
            if self.node.member != self.node.head
            else "before the nodes joined"
        )
        try:
            self.node.connecting = True
            for sig in [x for x in self.node.signals.received if x in STOPPING][:1]:
                raise Interrupted(sig)
            self.node.channel = control_channel.connect(
                *self._node0_at,
                timeout=max(1.0, self._join_deadline - time.monotonic()),
                setting=self.node.settings.join_timeout,
                log=lambda line: self.node.log.warning(line),
                identity=self.node.identity,
            )
        except Interrupted as got:
            raise NodeExit(
                128 + got.sig,
                f"received {signal_name(got.sig)} {waiting}: stopping (nothing was started)",
            ) from None
        finally:
            self.node.connecting = False

    def _receive_joining(self, timeout: float) -> list[m.Message]:
        """Node 0's messages; before its welcome, a closed connection is node 0 making room
        (a flood of connections, or more joining at once than it holds): this node joins
        again, with backoff, until its join timeout."""
        channel = self.node0
        if channel.welcomed:
            return self.receive(timeout)
        messages = channel.receive(timeout)
        if not channel.closed:
            return messages
        if channel.welcomed:
            return self.receive(0)  # closed after the welcome: node 0 is lost
        self._rejoins += 1
        left = self._join_deadline - time.monotonic()
        if left <= 0:
            raise NodeExit(
                EXIT_PEERS,
                f"node 0 at {channel.address} closed this node's connection before answering "
                f"its hello, {self._rejoins} times in ENTRYPOINT_JOIN_TIMEOUT="
                f"{self.node.settings.join_timeout:g} s: its control port is flooded or overloaded "
                "(node 0's log names what it dropped: 'connections waiting for their hello'). "
                "Find what floods the port; give the job a token and a network policy",
            )
        delay = min(left, 5.0, 0.25 * 2 ** min(self._rejoins - 1, 5)) * random.uniform(0.5, 1)
        self.node.log.warning(
            f"node 0 at {channel.address} closed the connection before answering this node's "
            f"hello (node 0 busy, or its control port flooded): joining again in {delay:.1f} s",
            tries=self._rejoins,
        )
        channel.close()
        time.sleep(delay)
        self._connect()
        self.node0.send(
            hello(
                self.node.plan,
                self.node.member,
                self.node.generation,
                self._fp,
                self._unhealthy,
                self._domain,
            )
        )
        return []

    def _check_health(self, restart: bool) -> None:
        """The checks before this start; what failed is said here and in the hello."""
        began = time.monotonic()
        failed = health.checks(self.node.plan, self.node.settings, restart)
        self._domain = health.nvlink_domain(self.node.plan.devices)
        self._unhealthy = "; ".join(f.line() for f in failed)
        for f in failed:
            self.node.log.error(f"health check failed: {f.line()}", check=f.check)
        if failed:
            self.node.log.error(
                f"this node failed {len(failed)} health check(s) in "
                f"{time.monotonic() - began:.1f} s: node 0 keeps it out of the job"
            )

    def say_hello(self, fp: Fingerprint | None = None) -> None:
        """Say hello (again, at a restart: `fp` None checks and fingerprints anew) and wait
        for `go`."""
        if fp is None:
            self._check_health(restart=True)
            fp = collect_fingerprint(self.node.plan, self.node.settings, not self._unhealthy)
        self.node0.send(
            hello(
                self.node.plan,
                self.node.member,
                self.node.generation,
                fp,
                self._unhealthy,
                self._domain,
            )
        )
        if self.node.member != self.node.head:
            self.node.log.info("joined node 0; waiting for every node", master=self.node0.address)
        self._await_go()

    def stop_before_start(self) -> None:
        """Keep the signals received before the trainer starts; a stopping one ends the node."""
        if self.node.stop_signal is None:
            for sig in self.node.signals.take():
                if sig in STOPPING:
                    self.node.stop_signal = sig
                    break
                if sig not in self.node.signals.pending:
                    self.node.signals.pending.append(sig)
                    self.node.log.warning(
                        f"received {signal_name(sig)} before the trainer started: "
                        "passed to the workers once they run"
                    )
        if self.node.stop_signal is not None:
            sig = self.node.stop_signal
            # Said to node 0, so that the other nodes stop now, not at the join timeout.
            self.node0.send(m.Exit(128 + sig, signal=sig))
            raise NodeExit(
                128 + sig,
                f"received {signal_name(sig)} before the trainer started"
                + (" again" if self.node.generation else "")
                + ": stopping",
            )

    def _await_go(self) -> None:
        deadline_silent = self.node.settings.heartbeat_timeout
        while True:
            self.stop_before_start()
            for message in self._receive_joining(0.5):
                match message:
                    case m.Go():
                        for warning in message.warnings:
                            self.node.log.warning(warning)
                        # A node its platform started again joins the job's restart, not
                        # start 0.
                        self.node.generation = message.generation
                        if message.etcd and self.node.on_etcd is not None:
                            self.node.on_etcd(message.etcd)
                        if message.nnodes is not None:
                            self._take_seat(message.seat, message.nnodes)
                        return
                    case m.Stop(code=code, reason=reason):
                        raise NodeExit(code, self.from_node0(reason))
                    case m.Elsewhere(holds=holds):
                        raise HeadElsewhere(holds)
            self.check_node0(deadline_silent)

    def _take_seat(self, seat: int | None, nnodes: int) -> None:
        """Node 0's seating for this start: stand by, or train in node rank `seat` of `nnodes`
        (planned again when that is not the seat the plan has)."""
        self.node.standing_by = seat is None
        plan = self.node.plan
        master = self.node.master
        moved = master is not None and master != plan.master_addr
        if seat is None or (
            not plan.standby and not moved and (seat, nnodes) == (plan.node_rank, plan.nnodes)
        ):
            return
        if self.node.replan is None:  # pragma: no cover - run() always passes one
            raise RuntimeError("node 0 seated this node anew, but it cannot plan again")
        self.node.plan, env = self.node.replan(seat, nnodes, master)
        self.node.env = without_token(env)
        if not plan.standby and (seat, nnodes) == (plan.node_rank, plan.nnodes):
            self.node.log.warning(
                f"the trainer's rendezvous moves to the new node 0: {self.node.plan.master_addr}"
            )
            return
        self.node.log.warning(
            f"node 0 seated this node in node rank {seat} of {nnodes}"
            + (
                " (it stood by)" if plan.standby else f" (it was {plan.node_rank} of {plan.nnodes})"
            ),
            world_size=self.node.plan.world_size,
            config=self.node.plan.config,
        )

    def stand_by(self) -> int | None:
        """A standby's life: beat, start no trainer, wait for node 0 to seat it (a restart),
        or for the job's end. None: the job restarts (and this node may train now)."""
        self.node.log.info("standing by: this node starts no trainer until node 0 gives it a seat")
        stats = Stats(self.node.plan.devices)
        last_beat = 0.0
        while True:
            now = time.monotonic()
            if now - last_beat >= self.node.settings.heartbeat_interval:
                last_beat = now
                self.node0.send(m.Beat(stats.read()))
            for sig in self.node.signals.take():
                if sig in STOPPING:
                    self.node0.send(m.Exit(128 + sig, signal=sig))
                    raise NodeExit(128 + sig, f"received {signal_name(sig)} while standing by")
            for message in self.receive(0.5):
                match message:
                    case m.Stop(code=code, reason=reason):
                        raise NodeExit(code, self.from_node0(reason))
                    case m.Done():
                        return 0
                    case m.Restart(generation=generation):
                        self.node.generation = generation
                        self.say_hello()
                        return None
            self.check_node0(self.node.settings.heartbeat_timeout)
