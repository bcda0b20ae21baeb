"""The edge that runs the job on this node: join the other nodes, start the launcher, watch it.

`entrypoint run` stays as a small parent of the launcher (torchrun, accelerate, JAX or the
trainer itself) instead of exec'ing it, because only a process that outlives the trainer can:
- wait for node 0 in any start order and refuse a cluster whose nodes differ (preflight);
- exchange heartbeats with the other nodes' entrypoints, independent of NCCL and the trainer,
  so that a killed, paused or cut-off node stops every node within seconds, naming it;
- forward SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 to the workers within a second and kill
  them when ENTRYPOINT_GRACE_PERIOD runs out (torchrun's own deadline is a fixed 30 s);
- show the failing rank's error once, restart every node's trainer together, and exit with a
  code a platform's retry policy can use (the failing rank's own code: an exit above 128 is a
  signal only when a node received that signal);
- be a child subreaper, give the launcher a parent-death signal and keep a guard process
  beside it, so that no worker outlives it, even when it is SIGKILLed outside a container.

Signals are taken at any moment: while waiting for node 0 (the connect is interrupted), during
the join and restarts (kept, or said to node 0), and before the workers exist (passed to each
worker once it catches the signal).
"""

from __future__ import annotations

import hashlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

from entrypoint import STOPPING, early_signals, signal_name
from entrypoint.consensus import election
from entrypoint.consensus.election import Holder
from entrypoint.consensus.etcd import Etcd, EtcdError
from entrypoint.control import control_channel, sockets
from entrypoint.control import messages as m
from entrypoint.control.transport import PeersError
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.job_record import resumed
from entrypoint.metrics import metrics_server
from entrypoint.metrics.metrics_server import MetricsServer
from entrypoint.plan import secrets
from entrypoint.plan.errors import EXIT_CONFIG, EXIT_HUNG, EXIT_PEERS
from entrypoint.plan.node_plan import Plan
from entrypoint.plan.settings import Settings
from entrypoint.plan.values import host_port
from entrypoint.supervise import failures, health, join, logs, procs, takeover
from entrypoint.supervise.gpu_stats import Stats
from entrypoint.supervise.knock import Knocker
from entrypoint.supervise.launcher_process import LauncherProcess, exit_status, start
from entrypoint.supervise.logs import Logger
from entrypoint.supervise.node_exits import (
    LOST_PEER_GRACE,
    PEER_STOP_GRACE,
    RESTART_GRACE,
    Interrupted,
    Node0Lost,
    NodeExit,
    Watch,
)
from entrypoint.supervise.node_state import NodeState, Replan
from entrypoint.supervise.own_etcd import OwnEtcd
from entrypoint.supervise.rank_inbox import Inbox
from entrypoint.supervise.worker_signals import FORWARDED, SignalRelay
from entrypoint.trainer_side.inner_launcher import REFUSED as INNER_LAUNCHER
from entrypoint.trainer_side.world_check import ELSEWHERE as MASTER_ELSEWHERE
from entrypoint.trainer_side.world_check import MISMATCH as WORLD_MISMATCH

# Seconds node 0 waits for the job's own etcd to answer (a quorum of its members started)


class Beats(threading.Thread):
    """This node's heartbeat while a launch runs, from a thread of its own: a step of the
    supervising loop that blocks (a worker given its grace to stop, a slow disk) does not
    silence the node. A beat that comes late (this process starved of CPU or stopped) is said,
    since node 0 may take this node for lost. A loop that has not turned for `stuck_after`
    seconds gets no more beats: an entrypoint stuck for good is lost, as a hung node is."""

    def __init__(
        self,
        channel: control_channel.Channel,
        settings: Settings,
        stats: Stats,
        inbox: Inbox,
        turn: Turn,
        stuck_after: float | None = None,
    ) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.channel, self.stats, self.inbox, self.turn = channel, stats, inbox, turn
        self.interval = settings.heartbeat_interval
        self.late = max(2.0 * self.interval, settings.heartbeat_timeout / 2)
        self.stuck_after = stuck_after or max(
            60.0, settings.grace_period + settings.heartbeat_timeout
        )
        self.log = turn.log
        self.halt = threading.Event()
        self.start()

    def run(self) -> None:
        last = time.monotonic()
        while not self.halt.is_set():
            now = time.monotonic()
            if now - last > self.late:
                self.log.warning(
                    f"this node's heartbeat went {now - last:.1f} s after the one before "
                    f"(every {self.interval:g} s): this node's entrypoint was starved of CPU "
                    "or stopped meanwhile, and node 0 may take it for lost"
                )
            last = now
            if now - self.turn.began <= self.stuck_after:
                ranks = tuple(self.inbox.reports(now))
                self.channel.send(m.Beat(self.stats.read(), ranks))
            self.halt.wait(self.interval)

    def stop(self) -> None:
        self.halt.set()
        if threading.current_thread() is not self:
            self.join(timeout=5)


class Turn:
    """The supervising loop's turns, timed: a turn that took half the heartbeat timeout or more
    (this process starved of CPU, paused, or a step of its own that blocked) is said, with its
    slowest step: signals and node 0's word waited that long."""

    def __init__(self, timeout: float, log: Logger) -> None:
        self.limit = max(1.0, timeout / 2)
        self.log = log
        self.began = self.at = time.monotonic()
        self.slowest = ("", 0.0)

    def mark(self, step: str) -> None:
        now = time.monotonic()
        if now - self.at > self.slowest[1]:
            self.slowest = (step, now - self.at)
        self.at = now

    def next(self) -> float:
        now = time.monotonic()
        took = now - self.began
        if took > self.limit:
            step, seconds = self.slowest
            self.log.warning(
                f"this node's entrypoint was held up {took:.1f} s in one turn of its loop "
                f"({step or 'between its steps'}: {seconds:.1f} s; CPU starved, paused or "
                "blocked): signals and node 0's messages waited meanwhile"
            )
        self.began = self.at = now
        self.slowest = ("", 0.0)
        return now


class Supervisor:
    """This node's life: join, start the launcher, watch it, restart it with the others, end."""

    def __init__(
        self,
        plan: Plan,
        env: Mapping[str, str],
        settings: Settings,
        log: Logger,
        echo: Callable[[str], None] | None = None,
        replan: Replan | None = None,
        resolved: Callable[[], tuple[Plan, dict[str, str]] | None] | None = None,
    ) -> None:
        self.resolved = resolved  # the plan again once the master's name resolves (node.py)
        self.secret_values = secrets.secret_values(env)
        raw_echo = echo or logs.echo
        # The site hook's word that the trainer formed another world than the plan's
        # (trainer_side/world_check.py), or that a launcher inside the command would have
        # (trainer_side/inner_launcher.py): the failure's reason, and exit 2 on every node.
        self.world_error: str | None = None

        def passed_on(line: str) -> None:
            # The trainer's stderr passes through here: a token in a traceback is masked too.
            # Once a world is refused, the refusal is the last word: what the launchers print
            # as they are stopped (torchrun's exit barrier losing node 0's store, the same
            # refusal from every rank) is not shown.
            if self.world_error is not None:
                return
            for marker in (WORLD_MISMATCH, MASTER_ELSEWHERE, INNER_LAUNCHER):
                if marker in line:
                    self.world_error = line[line.index(marker) :]
                    break
            raw_echo(secrets.mask(line, self.secret_values))

        self.echo = passed_on
        self.node = NodeState(
            plan=plan,
            settings=settings,
            log=log,
            env=join.without_token(env),  # the job's token is not the trainer's
            identity=join.identity(env, plan, settings),
            member=plan.member if plan.spawn or plan.rank is None else plan.rank,
            expected=plan.members if plan.spawn else plan.world_size,
            unit="node" if plan.spawn else "process",
            signals=SignalRelay(log, settings.grace_period),
            replan=replan,
            standing_by=plan.standby,  # a spare: no trainer until node 0 seats it
        )
        self.join = join.Join(self.node)
        self.settings, self.log = settings, log
        # Node 0's seat in etcd (ENTRYPOINT_ETCD), and why this node fenced itself (its lease as
        # node 0 could end): its trainers killed, it stops (supervise/takeover.py).
        self.seat: takeover.Node0Seat | None = None
        self.fencing: str | None = None  # why, from the fence's first instant
        self.abandoned: list[control_channel.Channel] = []  # lost node 0s' channels, kept open
        self.fenced = False  # its server stopped and its trainers killed: the loop ends the node
        found = takeover.connect(settings, self.node.identity) if plan.spawn else None
        # The job's own etcd (supervise/own_etcd.py): its endpoints once node 0 names its
        # members in the first `go`; this node's member of it, if node 0 chose this node.
        self.own_etcd: OwnEtcd | None = None
        own = 0
        if plan.spawn and found is None:
            own = takeover.own_etcd(settings, join.roster_of(plan, self.node.expected))
        if own:
            found = Etcd([]), takeover.job_key(self.node.identity) or "job"
            own_etcd = self.own_etcd = OwnEtcd(settings, self.node, *found, log=lambda: self.log)
            control = plan.control_port or 0
            self.node.etcd_members = own
            self.node.on_etcd = lambda entries: own_etcd.start(entries, control)
        if found is not None:
            self.seat = takeover.Node0Seat(*found, fence=self._fence, excused=self._nobody_else)
            token = self.node.identity.token
            digest = hashlib.sha256(token).hexdigest() if token else ""
            self.node.recorded = self.seat.recorder(digest)
        self.launch: LauncherProcess | None = None
        self.guard: procs.Guard | None = None
        self.log_dir = Path(settings.run_dir) / f"node{plan.member}" / "logs"
        self.inbox: Inbox | None = None  # the ranks' progress reports (rank_inbox)
        self.beats: Beats | None = None  # the heartbeat while a launch runs
        self.health: health.HealthWatch | None = None  # GPU and link events, from the join on
        self.signpost: MetricsServer | None = None  # not node 0: its metrics port points at it
        self.platform_node0 = (plan.master_addr, plan.control_port)  # where node 0 starts again
        self.knocker: Knocker | None = None  # a new node 0's, knocking there (supervise/knock.py)

    @property
    def plan(self) -> Plan:
        """The plan this node trains with now (node 0 may seat it anew at a restart)."""
        return self.node.plan

    @property
    def node0(self) -> control_channel.Channel:
        """The channel to node 0, which exists from the join on."""
        return self.join.node0

    @property
    def launched(self) -> LauncherProcess:
        """The current launch, which exists from the first start on."""
        assert self.launch is not None, "no launch before the first start"
        return self.launch

    # signals arrive in the main thread; they are handled in the loop, except while this node
    # waits for node 0 (a blocking connect), which a stopping signal ends at once
    def _on_signal(self, number: int, _frame: FrameType | None) -> None:
        if self.node.connecting and number in STOPPING:
            self.node.connecting = False
            raise Interrupted(number)
        self.node.signals.received.append(number)

    def run(self) -> int:
        procs.become_subreaper()
        for sig in FORWARDED:
            signal.signal(sig, self._on_signal)
        # A signal whose exception Python dropped before these handlers (entrypoint/__init__.py)
        self.node.signals.received.extend(early_signals)
        early_signals.clear()
        try:
            self._find_head()
            self.node.server_failed = self._server_failed
            self.join.start()
            self._hold_seat()
            self._signpost()
            if self.settings.health_checks:
                self.health = health.watch(self.plan, self.log, lambda: self.node.channel)
            again = self.resolved() if self.resolved is not None else None
            if again is not None:
                self.node.plan, self.node.env = again[0], join.without_token(again[1])
            while True:
                try:
                    code = self.join.stand_by() if self.node.standing_by else self._supervise()
                except Node0Lost as lost:
                    self._take_over(lost)  # a survivor is node 0 now: join it, or NodeExit
                    continue
                if code is not None:
                    return code & 0xFF
        except NodeExit as stop:
            if stop.reason:
                level = "info" if stop.code == 0 else "error"
                getattr(self.log, level)(stop.reason, exit_code=stop.code)
            return stop.code & 0xFF
        except PeersError as err:
            self.log.error(str(err), exit_code=err.exit_code)
            return err.exit_code
        finally:
            self._cleanup()

    def _signpost(self) -> None:
        """A node other than node 0 points its metrics port at node 0's /metrics (a 307,
        wherever node 0 is now: after a takeover too), so that `entrypoint status <any node>`
        and a Prometheus that scrapes every node find node 0."""
        port = self.plan.metrics_port
        if not port or self.node.member == self.node.head or self.node.expected < 2:
            return

        def where() -> str | None:
            master = self.node.master or self.plan.master_addr
            return f"http://{host_port(master, port)}/metrics" if master else None

        self.signpost = metrics_server.signpost(port, sockets.ANY, where)

    # -- supervise one launch ---------------------------------------------------------------

    def _supervise(self) -> int | None:
        """Start the launcher and watch it. An exit code ends the node; None: restart."""
        s = self.settings
        if self.guard is None:
            self.guard = procs.Guard(s.grace_period)
        failures.prune(self.log_dir, failures.KEEP_LOG_RUNS)
        inbox = self._inbox()
        inbox.new_launch()
        launch = self.launch = start(
            self.plan, self.node.env | inbox.env(), self.node.generation, self.echo
        )
        last_reap = 0.0
        watch = Watch()
        self.node.signals.new_launch()
        turn = Turn(s.heartbeat_timeout, self.log)
        beats = self.beats = Beats(self.node0, s, Stats(self.plan.devices), inbox, turn)
        try:
            while True:
                code = self._turn(turn, inbox, launch, watch)
                if code is not False:
                    return code
                if turn.at - last_reap >= s.heartbeat_interval:
                    last_reap = turn.at
                    procs.reap(exclude=launch.process.pid)
                    turn.mark("reaping orphans")
        except Node0Lost:  # the workers hang in their next collective: a moment to flush, then go
            # (at once where a survivor takes node 0's seat: the job's next start waits on them)
            self._end_workers(RESTART_GRACE if self.seat is not None else LOST_PEER_GRACE)
            raise
        finally:
            beats.stop()

    def _turn(
        self, turn: Turn, inbox: Inbox, launch: LauncherProcess, watch: Watch
    ) -> int | None | bool:
        """One turn of the supervising loop; False: go on."""
        s = self.settings
        now = turn.next()
        if inbox.dump_ready(now):
            self._send_stacks(inbox)
            turn.mark("the ranks' stacks")
        self._handle_signals(watch, now)
        if watch.code is None:
            for sig in self.node.signals.deliver_late(
                launch, watch.signalled, watch.signalled_at, now
            ):
                self.node0.send(m.Signal(sig))
        if watch.kill_at is not None and now > watch.kill_at and launch.running():
            self.log.error(
                f"workers still running {s.grace_period:g} s after the signal: killing them"
            )
            launch.kill_all()
            watch.kill_at = None
        turn.mark("signals")
        self._note_exit(watch)
        turn.mark("the trainer's exit")
        for message in self.join.receive(0.2 if watch.code is None else 0.5):
            ended, code = self._on_message(message, watch, now)
            if ended:
                return code
        turn.mark("node 0's messages")
        self.join.check_node0(s.heartbeat_timeout)
        if self.fenced:
            raise self._fenced()
        return False

    def _handle_signals(self, watch: Watch, now: float) -> None:
        """The signals this node received since the last turn of the loop."""
        for sig in self.node.signals.take():
            if sig in STOPPING and watch.signalled is not None:
                self.log.warning(
                    f"received {signal_name(sig)} again: already "
                    "stopping, the workers are killed when the grace ends"
                )
                continue
            if sig in STOPPING:
                self.node.stop_signal = sig
                if watch.code is not None:  # the trainer has exited: the job must not restart
                    self.log.warning(
                        f"received {signal_name(sig)} after the trainer exited: "
                        "the job stops, no restart"
                    )
                else:
                    self.node.signals.pass_on(self.launched, sig, f"received {signal_name(sig)}")
                    watch.stopping(sig, now, self.settings.grace_period)
                # Node 0 passes a stopping signal to every node's workers (one pod preempted).
                self.node0.send(m.Signal(sig))
            elif watch.code is None:
                if not self.node.signals.pass_on(
                    self.launched, sig, f"received {signal_name(sig)}"
                ):
                    self.node.signals.pending.append(sig)  # no worker yet: for them when they start
                else:
                    self.node.signals.told.add(sig)
                    self.node0.send(m.Signal(sig))

    def _note_exit(self, watch: Watch) -> None:
        """Once the launcher exited: kill what it left and say its exit to node 0."""
        code = self.launched.process.poll()
        watch.code = exit_status(code) if code is not None else None
        if watch.code is not None and not watch.reported:
            watch.reported, seen = True, self.launched.ended_at or time.time()
            self._kill_leftovers()  # a launcher that died leaves its workers headless
            self._report_exit(watch.code, watch.signalled, seen)

    def _on_message(self, message: m.Message, watch: Watch, now: float) -> tuple[bool, int | None]:
        """One message from node 0; (True, what `_supervise` returns) when the launch ends."""
        match message:
            case m.Stop():
                return True, self._stopped(message, watch.signalled, watch.kill_at)
            case m.Signal(signal=sig, reason=reason):
                if watch.signalled is None and watch.code is None:
                    self.node.signals.pass_on(self.launched, sig, reason)
                    watch.stopping(sig, now, self.settings.grace_period)
                    self.node.stop_signal = sig
            case m.Dump(silent=silent) if self.inbox is not None:
                self.log.warning(
                    f"node 0 says no rank has stepped for {silent:.0f} s: "
                    f"writing this node's ranks' stacks into {self.inbox.stacks_dir}"
                )
                self.inbox.dump(now)
            case m.Done():
                self.launched.stop(5)
                return True, 0 if watch.code == 0 else (watch.code or 0)
            case m.Restart():
                self._restart(message)
                return True, None
        return False, None

    def _restart(self, message: m.Restart) -> None:
        """Node 0 restarts the job: end this launch, join again (None: start anew)."""
        if self.beats is not None:
            self.beats.stop()  # the old launch's ranks are no news for the new one
        began = time.monotonic()
        self._end_launch(RESTART_GRACE)
        self.node.generation = message.generation
        if self.node.member != 0 and self.node.stop_signal is None:
            # node 0's conductor has said it already
            self.log.warning(
                f"restarting the trainer ({message.reason})", restart=self.node.generation
            )
        # Where a restart's seconds go: the old workers' exit, then the join and the start.
        self.log.info(
            f"the last start's launcher and workers ended {time.monotonic() - began:.2f} s "
            "after the restart was called; joining node 0 again",
            restart=self.node.generation,
        )
        self.join.say_hello()  # with a stop signal: says so to node 0 and stops

    def _report_exit(self, code: int, signalled: int | None, seen: float) -> None:
        who = f"{self.node.unit} {self.node.member} ({socket.gethostname()})"
        if self.world_error is not None and signalled is None:
            # Every node stops with the site hook's line: a restart would form the same world.
            # Even at exit 0: a start script that went on past its refused launcher trained
            # nothing.
            reason = f"{who}: {secrets.mask(self.world_error, self.secret_values)}"
            self.node0.send(m.Exit(EXIT_CONFIG, reason=reason[:4000]))
            return
        self.node0.send(
            failures.exit_report(
                self.plan,
                self.launched,
                code,
                signalled,
                delivered=self.node.signals.delivered,
                log_dir=self.log_dir,
                seen=seen,
                who=who,
                mask=lambda line: secrets.mask(line, self.secret_values),
            )
        )

    def _stopped(self, message: m.Stop, signalled: int | None, kill_at: float | None) -> int:
        code, reason, sig = message.code & 0xFF, message.reason, message.signal
        launch = self.launched
        if launch.running() and signalled is not None and kill_at is not None:
            # The workers have the signal already: what is left of their grace.
            launch.stop(max(0.0, kill_at - time.monotonic()))
        elif launch.running() and sig:
            # Stopped on a signal another node received: the workers checkpoint too.
            launch.stop(self.settings.grace_period, int(sig))
        elif launch.running():
            # Another node failed, whatever its code: SIGTERM, and the workers are killed if
            # they do not exit (at once after a lost node: their collectives cannot complete).
            grace = LOST_PEER_GRACE if code in (EXIT_PEERS, EXIT_HUNG) else PEER_STOP_GRACE
            launch.stop(grace, signal.SIGTERM)
        raise NodeExit(code, self.join.from_node0(reason))

    # -- node 0's seat in etcd (supervise/takeover.py) ---------------------------------------

    def _me(self) -> Holder:
        host = socket.gethostname()
        return Holder(self.node.member, host, host_port(host, self.plan.control_port or 0))

    def _hold_seat(self) -> None:
        """Node 0, once the job formed: its seat in etcd when there is one, and its one line on
        what losing node 0 costs; on the job's own etcd, from a thread of its own once that
        etcd answers (the trainer does not wait for it)."""
        if self.node.member != self.node.head or not self.plan.spawn:
            return
        roster = join.roster_of(self.plan, self.node.expected)
        if self.own_etcd is not None and self.own_etcd.etcd.endpoints:
            line = takeover.survival(None, roster, self.plan.members, self.node.etcd_members)
            threading.Thread(
                target=self.own_etcd.hold_seat,
                args=(self._seat_taken, line or ""),
                name="node0-seat",
                daemon=True,
            ).start()
            return
        line = takeover.survival(self.settings.etcd, roster, self.plan.members)
        if self.seat is not None and roster.elastic:
            why = self._seat_taken()
            if why is not None:
                line = (
                    f"losing node 0 ends this job: node 0 could not take its seat in etcd ({why})"
                )
        if line is not None:
            self.log.info(line)

    def _seat_taken(self) -> str | None:
        """Node 0 takes its seat: None, or why it could not."""
        assert self.seat is not None
        try:
            held = self.seat.hold(self._me())
        except EtcdError as err:
            return str(err)
        return "another node of this job's id holds it" if held is None else None

    def _find_head(self) -> None:
        """A node started again by its platform after a survivor took node 0's seat in etcd: it
        joins that node 0 (and stands by, or takes a rank); node 0 never serves a second job
        beside it, and no node waits at the lost node 0's address. (On the job's own etcd, whose
        endpoints it does not know yet, the knock and node 0's port tell it: `Join.start`.)"""
        if self.seat is None:
            return
        etcd, job = self.seat.etcd, self.seat.job
        try:
            held = election.holder(etcd, job)
            if held is None or held.member == 0:
                return
            # Held by another member: alive, or lost with the rest of the job (the platform
            # starting the whole job again), whose lease ends within TTL. Gone: a new start.
            if election.wait_vacant(etcd, job, takeover.SEAT_WAIT):
                return
            held = election.holder(etcd, job)
        except EtcdError:
            return
        if held is None or held.member == 0:
            return
        self.log.warning(
            f"node {held.member} ({held.host}) holds node 0's seat in etcd: this node, started "
            "again, joins it"
        )
        self.node.head, self.node.master = held.member, held.host

    def _nobody_else(self) -> str | None:
        """Asked by node 0's lease keeper when no renewal answered: why no other node could take
        node 0's seat now, or None (then it fences). On the job's own etcd, once the members
        whose nodes ended (their connections closed with no word: their processes, and their
        etcd members, gone) leave fewer than etcd's quorum, no node can take the seat: node 0
        goes on without one, and its own loss ends the job from then on."""
        recording = self.seat.recording if self.seat is not None else None
        if self.own_etcd is None or recording is None:
            return None
        for _ in range(5):  # the control server's thread may add to it meanwhile
            try:
                gone = set(recording.conductor.job.gone)
                break
            except RuntimeError:
                continue
        else:
            return None
        why = self.own_etcd.quorum_lost(gone)
        if why is not None:
            self.log.warning(why)
        return why

    def _farewell(self) -> None:
        """A survivor leaving a node 0 it took for lost says so before its connection closes:
        a node 0 that was only stopped or cut off and comes back must not count it among the
        nodes that ended (`_nobody_else`). Said or not, the connection is this node's no more."""
        channel = self.node.channel
        if channel is None or channel.closed:
            return
        if channel.send(m.Exit(EXIT_PEERS, reason="node 0 lost: this node leaves it")):
            channel.close()
        else:  # no room to say it: the connection is left open, so that no close is seen
            self.abandoned.append(channel)
        self.node.channel = None

    def _fence(self, why: str) -> None:
        """From the lease keeper's thread: this node, node 0, can no longer be sure it holds its
        seat; its control server stops and its trainers are killed now (well within the
        lease's MARGIN), and its loop ends the node."""
        self.fencing = why  # this node's own channel closing now is no lost node 0
        if self.knocker is not None:
            self.knocker.stop()
        server = self.node.server
        if server is not None:  # first: node 0's mind must not judge its own trainers' end
            server.stop()  # the others see node 0 gone, with no verdict, and elect another
            server.finished.wait(timeout=1)
        if self.launch is not None and self.launch.running():
            self.launch.kill_all()
        self.fenced = True

    def _server_failed(self) -> None:
        """From node 0's control server's thread, when it fails (a bug): its trainers are killed
        before its connections close. Every survivor then hears node 0 hang up and takes its
        seat (supervise/takeover.py); this node finds its lease ended and fences."""
        if self.launch is not None and self.launch.running():
            self.launch.kill_all()

    def _fenced(self) -> NodeExit:
        return NodeExit(
            EXIT_PEERS,
            f"this node lost node 0's seat in etcd ({self.fencing}): its trainers were stopped, "
            "so that two nodes 0 never train at once",
        )

    def _take_over(self, lost: Node0Lost) -> None:
        """Node 0 was lost: elect a new one through etcd, serve the job from its record if this
        node won, and join it; NodeExit when the job cannot go on (no etcd: `lost` itself)."""
        while True:
            if self.seat is not None and self.seat.keeper is not None:
                # Node 0 lost its own channel to its own server: cut off from the network (its
                # interface gone), it is the one lost. Its lease keeper decides: the fence, once
                # no renewal answers, or the loss as it is while renewals do.
                deadline = time.monotonic() + self.seat.ttl
                while self.fencing is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            if self.fencing is not None:  # its own control server stopped: no lost node 0
                deadline = time.monotonic() + 2
                while not self.fenced and time.monotonic() < deadline:
                    time.sleep(0.05)  # the trainers killed first
                raise self._fenced()
            if self.seat is None or self.seat.keeper is not None or self.node.stop_signal:
                raise lost
            self._farewell()
            self.log.warning(f"{lost.reason}; electing a new node 0 through etcd")
            roster = join.roster_of(self.plan, self.node.expected)
            me = self._me()
            gone = self.node.head
            won = self.seat.take_over(lost, me, roster, gone)
            record, holder = won.record, won.holder
            self.log.warning(
                f"node 0 ({record.hosts.get(gone) or self.node.master or self.plan.master_addr})"
                f" lost; node {holder.member} "
                f"({holder.host}) is node 0 from restart {won.restart}"
            )
            if won.keeper is not None:
                if self.signpost is not None:  # node 0's /metrics takes its port
                    self.signpost.shutdown()
                    self.signpost = None
                self.log = self.node.log = logs.for_node(  # it speaks as node 0 from now on
                    self.settings, self.node.member, self.secret_values, head=True
                )
                job = resumed(
                    record,
                    me.member,
                    won.alive,
                    expected=self.node.expected,
                    limits=join.limits_of(self.settings, self.node.expected),
                    roster=roster,
                    now=time.monotonic(),
                    unit=self.node.unit,
                    address=me.address,
                    why=lost.reason,
                )
                if self.platform_node0[1] and me.member != 0:
                    self.knocker = Knocker(
                        (self.platform_node0[0], self.platform_node0[1]),
                        me,
                        self.node.identity,
                        self.join.fingerprint,
                    )
                    self.knocker.start()
                self.node.server, _, _ = join.serve(
                    self.plan,
                    self.settings,
                    self.node.expected,
                    self.node.unit,
                    self.join.server_log,
                    self.node.identity,
                    resumed=Conductor.resume(job),
                    recorded=self.node.recorded,
                    host=me.host,
                    failed=self.node.server_failed,
                )
            self.node.head, self.node.master = holder.member, holder.host
            if self.join.pointing is not None:  # node 0 started again: its port points on
                self.join.pointing[0].moved(holder)
            host, _, port = holder.address.rpartition(":")
            try:
                self.join.rejoin(host.strip("[]"), int(port))
                return
            except Node0Lost as again:  # the new node 0 lost too, before the job went on
                lost = again

    # -- helpers ----------------------------------------------------------------------------

    def _inbox(self) -> Inbox:
        if self.inbox is None:
            self.inbox = Inbox(self.log_dir / "stacks")
            flight = self.plan.env.get("TORCH_FR_DUMP_TEMP_FILE")
            if flight:  # torch writes its Flight Recorder dumps there, and makes no directory
                Path(flight).parent.mkdir(parents=True, exist_ok=True)
        return self.inbox

    def _send_stacks(self, inbox: Inbox) -> None:
        stacks = inbox.stacks()
        self.node0.send(m.Stacks(tuple(stacks)))

    def _end_workers(self, grace: float) -> None:
        """SIGTERM to a running launch's workers, `grace` to exit, then SIGKILL (at once, with
        no SIGTERM, when `grace` is 0)."""
        if self.launch is not None and self.launch.running():
            self.launch.stop(grace, signal.SIGTERM if grace > 0 else None)

    def _end_launch(self, grace: float) -> None:
        self._end_workers(grace)
        self._kill_leftovers()  # a restart must not start beside the last launch's orphans
        self.node.signals.drop_pending()

    def _kill_leftovers(self) -> None:
        guard = self.guard.pid if self.guard is not None else -1
        launcher = self.launch.process.pid if self.launch else -1
        own = self.own_etcd.proc if self.own_etcd is not None else None
        keep = (own.pid,) if own is not None else ()
        procs.kill_leftovers(self.log, guard, launcher, keep=keep)

    def _cleanup(self) -> None:
        if self.knocker is not None:
            self.knocker.stop()
        self.join.close()
        if self.health is not None:
            self.health.stop()
        if self.signpost is not None:
            self.signpost.stop()
        if self.launch is not None:
            self._kill_leftovers()
        if self.inbox is not None:
            self.inbox.close()
        if self.node.channel is not None:
            self.node.channel.close()
        if self.node.server is not None:
            if self.fencing is None:  # fenced: the others must see node 0 gone, at once
                self.node.server.finished.wait(timeout=12)
            self.node.server.stop()
        if self.seat is not None:
            self.seat.close(revoke=not self.node.etcd_members)  # the job's own: ends with it
        if self.own_etcd is not None:
            self.own_etcd.stop()
        if self.guard is not None:
            self.guard.close()


def run(
    plan: Plan,
    env: Mapping[str, str],
    settings: Settings,
    log: Logger,
    replan: Replan | None = None,
    resolved: Callable[[], tuple[Plan, dict[str, str]] | None] | None = None,
) -> int:
    """Run this node's part of the job to its end: join, launch, supervise, restart, stop.

    Args:
        plan: this node's plan (entrypoint.plan.node_plan.make_plan), its files already written.
        env: the trainer's environment (the job's token is taken out of it here).
        settings: the ENTRYPOINT_* settings the plan was made with.
        log: the node's logger (entrypoint.supervise.logs.setup).
        replan: plans this node again for the seat node 0 gives it (node rank, nnodes).
        resolved: the plan again once the master's name resolves, or None.

    Returns:
        The exit code for the node (0-255): 0, the trainer's own, 2 (configuration), 75 (a peer
        lost or silent), 124 (a rank hung) or 128 + N (signal N). Raises nothing: every error
        of the job ends as its code and one line in the log.
    """
    code = Supervisor(plan, env, settings, log, replan=replan, resolved=resolved).run()
    return code if code is not None else EXIT_CONFIG
