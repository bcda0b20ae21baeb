"""Node 0's seat in etcd (ENTRYPOINT_ETCD), on both sides (docs/failures.md, "Losing node 0").

Node 0 holds the seat from the job's first `go`: a key bound to its lease, which it renews, and
under whose term it writes the job's record (`Recorder`, `Publisher`) whenever the record
changes. If it cannot renew, it fences: its trainers are killed before the lease could end.

When node 0 is lost, each survivor reads the record, says at once if the job cannot go on
without node 0 (no spare, no minimum: it ends as before), waits for the lost node 0's lease to
end, and campaigns. The one etcd lets create the key is node 0 from then on: it serves the
control channel and `/metrics` from the record (`Conductor.resume`), and every survivor joins it
as it joined node 0, its trainer's rendezvous moved to the new node 0's host.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from entrypoint.consensus import election, embedded
from entrypoint.consensus.election import Holder
from entrypoint.consensus.etcd import Etcd, EtcdError
from entrypoint.consensus.lease import MARGIN, TTL, LeaseKeeper
from entrypoint.control.actions import Action
from entrypoint.control.identity import Identity
from entrypoint.control.messages import Beat, Exit, Health, Hello, Signal, Stacks
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.job_record import NOT_ELASTIC, JobRecord, cannot_go_on, record_of
from entrypoint.coordinator.roster import Roster
from entrypoint.plan.errors import EXIT_PEERS, ConfigError
from entrypoint.plan.settings import PREFIX, Settings
from entrypoint.plan.values import ETCD_OFF, endpoints_from, etcd_https
from entrypoint.supervise.node_exits import Node0Lost, NodeExit

# Seconds a survivor waits for a lost node 0's seat to be free: its lease ends at most TTL after
# its last renewal, and etcd's own clock ticks it out a moment later.
SEAT_WAIT = TTL + 3.0
RETRY = 0.5  # seconds between tries of a record etcd did not take
# Seconds the survivors of a node 0 that hung up on them have to say so, each, before its seat
# is freed at once (every member connected to node 0 hears its end within a fraction of a
# second), and a second more per 1,000 of them (4,095 said so in 2.5 s to one etcd on this
# machine's 2 cores: benchmarks/node0_seat.py); how often the lowest survivor reads their word.
HANGUP_WAIT = 3.0
HANGUP_WAIT_PER_MEMBER = 0.001
HANGUP_POLL = 0.1


def job_key(identity: Identity) -> str:
    """The job's name in etcd's keys: its identity (`ENTRYPOINT_JOB_ID=train-42`), made safe."""
    return re.sub(r"[^A-Za-z0-9._=-]", "_", identity.job)[:200]


def external(settings: Settings) -> bool:
    """Whether ENTRYPOINT_ETCD names an etcd's endpoints (not unset, not `off`)."""
    return _named(settings.etcd)


def _named(etcd: str | None) -> bool:
    return bool(etcd) and str(etcd).strip().lower() != ETCD_OFF


def own_etcd(settings: Settings, roster: Roster) -> int:
    """How many of the job's members run its own etcd (consensus/embedded.py): none with
    ENTRYPOINT_ETCD (its endpoints, or `off`), without spares or a minimum (a lost node ends
    the job anyway), under 3 members (etcd's quorum survives no loss of 1 or 2), or without etcd
    in the image."""
    if settings.etcd or not roster.elastic or embedded.binary() is None:
        return 0
    return embedded.cluster_size(roster.members)


def connect(settings: Settings, identity: Identity) -> tuple[Etcd, str] | None:
    """etcd and the job's key there when ENTRYPOINT_ETCD names one, spoken to over TLS and
    logged in as its settings say; None without it.

    Raises:
        ConfigError: ENTRYPOINT_ETCD is set but the job has no name its keys could carry; a
            TLS file cannot be used; a user without a password; TLS or auth settings given
            for no ENTRYPOINT_ETCD.
    """
    given = [n for n in _ACCESS if getattr(settings, n) is not None]
    if not settings.etcd or not external(settings):
        if given:
            variable = f"{PREFIX}{given[0].upper()}"
            raise ConfigError(
                variable,
                "***" if given[0] == "etcd_password" else str(getattr(settings, given[0])),
                f"is for an etcd named by {PREFIX}ETCD, and none is (the job's own etcd keys its "
                "TLS and auth from the job token)",
                f"Set {PREFIX}ETCD to the etcd's endpoints, or unset {variable}",
            )
        return None
    if not identity.job:
        raise ConfigError(
            f"{PREFIX}ETCD",
            settings.etcd,
            "the job has no id to name its keys in etcd (the platform gives none)",
            f"Set {PREFIX}JOB_ID to the same value on every node of the job",
        )
    etcd = Etcd(endpoints_from(settings.etcd), tls=tls_of(settings))
    if settings.etcd_user is not None:
        if settings.etcd_password is None:
            raise ConfigError(
                f"{PREFIX}ETCD_USER",
                settings.etcd_user,
                "has no password",
                f"Set {PREFIX}ETCD_PASSWORD to the password of etcd's user {settings.etcd_user}",
            )
        etcd.credentials(settings.etcd_user, settings.etcd_password.get_secret_value())
    elif settings.etcd_password is not None:
        raise ConfigError(
            f"{PREFIX}ETCD_PASSWORD",
            "***",
            "names no user",
            f"Set {PREFIX}ETCD_USER to etcd's user whose password it is",
        )
    return etcd, job_key(identity)


_ACCESS = ("etcd_cacert", "etcd_cert", "etcd_key", "etcd_user", "etcd_password")


def tls_of(settings: Settings) -> ssl.SSLContext | None:
    """How to speak to ENTRYPOINT_ETCD: TLS where its endpoints say https, or where a CA or a
    client certificate is given for `HOST:PORT` endpoints (as etcdctl does); None: plain HTTP.

    Raises:
        ConfigError: a file that is not what its variable says, or `http://` endpoints given
            a CA or a certificate.
    """
    named = (settings.etcd_cacert, settings.etcd_cert, settings.etcd_key)
    https = etcd_https(settings.etcd or "")
    if https is False and any(named):
        raise ConfigError(
            f"{PREFIX}ETCD",
            str(settings.etcd),
            f"is http://, and {PREFIX}ETCD_CACERT, _CERT or _KEY is set for TLS",
            f"Set {PREFIX}ETCD to https:// endpoints, or unset the TLS files",
        )
    if not https and not any(named):
        return None
    cacert, cert, key = named
    if key is not None and cert is None:
        raise ConfigError(
            f"{PREFIX}ETCD_KEY",
            str(key),
            "is a key with no certificate",
            f"Set {PREFIX}ETCD_CERT to the client certificate this key belongs to",
        )
    try:
        context = ssl.create_default_context(cafile=str(cacert) if cacert else None)
        # As etcdctl and etcd's Go clients check a certificate, not Python 3.13's stricter way:
        # a platform's CA without a key usage extension is still its CA.
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(
            f"{PREFIX}ETCD_CACERT",
            str(cacert),
            f"cannot be read as CA certificates ({err})",
            f"Set {PREFIX}ETCD_CACERT to the PEM file of the CA that signed etcd's certificate",
        ) from None
    if cert is not None:
        try:
            context.load_cert_chain(str(cert), str(key) if key else None)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(
                f"{PREFIX}ETCD_CERT",
                str(cert),
                f"cannot be read as a certificate and its key ({err})",
                f"Set {PREFIX}ETCD_CERT and {PREFIX}ETCD_KEY to the client's PEM files",
            ) from None
    return context


def survival(etcd: str | None, roster: Roster, nnodes: int, own: int = 0) -> str | None:
    """Node 0's one line at the start: whether the job outlives losing node 0, and what it would
    take; None for a job of one node. `own`: how many members run the job's own etcd."""
    if nnodes <= 1:
        return None
    need = f"{PREFIX}SPARES or {PREFIX}MIN_NODES"
    named = _named(etcd)
    if not roster.elastic:
        if named:
            return (
                f"losing node 0 (or any node) ends this job: it has no spare and no minimum "
                f"({need})"
            )
        return (
            f"losing node 0 ends this job (every node exits 75): {need}, on 3 nodes or more "
            f"(or with {PREFIX}ETCD, an etcd's endpoints), would let a survivor take its place"
        )
    if named:
        return (
            f"losing node 0 costs a restart, not the job: node 0's seat is in etcd ({etcd}); a "
            "survivor takes it over, and a spare or the survivors train on"
        )
    if own:
        return (
            f"losing node 0 costs a restart, not the job: node 0's seat is in the job's own "
            f"etcd, on {own} of its nodes; a survivor takes it over, and a spare or the "
            "survivors train on"
        )
    if etcd:
        return f"losing node 0 ends this job: {PREFIX}ETCD={ETCD_OFF}"
    if embedded.binary() is None:
        why = "this image carries no etcd"
    else:
        why = f"the job's own etcd needs 3 nodes, it has {roster.members}"
    return (
        f"losing node 0 ends this job (every node exits 75): {why}; {PREFIX}ETCD (an etcd's "
        "endpoints) would let a survivor take its place"
    )


class Publisher(threading.Thread):
    """Writes the latest record node 0 offers to etcd, as node 0 of its term, from a thread of
    its own: the control server never waits on etcd. A write etcd refuses because the term has
    ended calls `lost(why)` once: another node holds node 0's seat."""

    def __init__(self, etcd: Etcd, job: str, lost: Callable[[str], None]) -> None:
        super().__init__(name="job-record", daemon=True)
        self.etcd, self.job, self.lost = etcd, job, lost
        self.holder: Holder | None = None
        self.latest = ""
        self.written = ""
        self.wake = threading.Event()
        self.halt = threading.Event()
        self.start()

    def hold(self, holder: Holder) -> None:
        """Write from now on, as node 0 of `holder.term`."""
        self.holder = holder
        self.wake.set()

    def offer(self, record: str) -> None:
        if record != self.latest:
            self.latest = record
            self.wake.set()

    def stop(self) -> None:
        self.halt.set()
        self.wake.set()

    def run(self) -> None:
        while not self.halt.is_set():
            self.wake.wait()
            self.wake.clear()
            holder, latest = self.holder, self.latest
            if self.halt.is_set() or holder is None or not latest or latest == self.written:
                continue
            try:
                ok = election.publish(self.etcd, self.job, holder, json.loads(latest))
            except EtcdError:
                self.halt.wait(RETRY)
                self.wake.set()  # the lease keeper fences if etcd stays away
                continue
            if not ok:
                self.lost(f"etcd refused the job's record: node 0's term {holder.term} has ended")
                return
            self.written = latest


class Recorder:
    """Node 0's Conductor as its control server sees it: each event passes through, and after
    each tick (every 0.5 s) the job's record is offered to the Publisher when it changed."""

    def __init__(self, conductor: Conductor, publisher: Publisher, token_digest: str) -> None:
        self.conductor, self.publisher, self.digest = conductor, publisher, token_digest

    @property
    def expected(self) -> int:
        return self.conductor.expected

    @property
    def ended(self) -> bool:
        return self.conductor.ended

    def hello(self, member: int, message: Hello, now: float, wall_now: float) -> list[Action]:
        return self.conductor.hello(member, message, now, wall_now)

    def beat(self, member: int, message: Beat, now: float) -> list[Action]:
        return self.conductor.beat(member, message, now)

    def exited(self, member: int, message: Exit, now: float) -> list[Action]:
        return self.conductor.exited(member, message, now)

    def signalled(self, member: int, message: Signal, now: float) -> list[Action]:
        return self.conductor.signalled(member, message, now)

    def stacks(self, member: int, message: Stacks, now: float) -> list[Action]:
        return self.conductor.stacks(member, message, now)

    def health(self, member: int, message: Health, now: float) -> list[Action]:
        return self.conductor.health(member, message, now)

    def closed(self, member: int, now: float) -> list[Action]:
        return self.conductor.closed(member, now)

    def tick(self, now: float) -> list[Action]:
        actions = self.conductor.tick(now)
        self.publisher.offer(record_of(self.conductor.job, self.digest).to_json())
        return actions


@dataclass(frozen=True)
class Election:
    """What a survivor learned when node 0 was lost: node 0 from now on, the record it goes on
    from, the members taken for alive, the restart the job goes on with, and this node's lease
    keeper if it won."""

    holder: Holder
    record: JobRecord
    alive: frozenset[int]
    keeper: LeaseKeeper | None
    restart: int = 0


def _record(lost: Node0Lost, state: dict[str, object] | None, me: int) -> JobRecord:
    """Node 0's record in etcd, as a survivor reads it before it takes node 0's place. Raises
    NodeExit (75, why) when there is none, it does not parse, or it names this node lost: node
    0 went on without it, so node 0 was alive then and this node is the one cut off."""
    if state is None:
        raise NodeExit(EXIT_PEERS, f"{lost.reason}; node 0 wrote no record of the job to etcd")
    try:
        record = JobRecord.from_json(json.dumps(state))
    except ValueError as err:
        raise NodeExit(EXIT_PEERS, f"{lost.reason}; node 0's record in etcd: {err}") from None
    if me in record.lost:
        raise NodeExit(
            EXIT_PEERS,
            f"{lost.reason}; node 0 went on without this node (it took it for lost: "
            f"{record.lost[me]}), so node 0 was alive and this node is the one cut off from it",
        )
    return record


class Node0Seat:
    """This node's side of node 0's seat in etcd: held (`hold`) by node 0 from the first `go`
    and by whoever takes it over (`take_over`); `fence(why)` is called, from the lease keeper's
    thread, when the holder can no longer be sure its lease lives."""

    def __init__(
        self,
        etcd: Etcd,
        job: str,
        fence: Callable[[str], None],
        ttl: int = TTL,
        excused: Callable[[], str | None] | None = None,
    ) -> None:
        """excused: why no other node could take the seat now (LeaseKeeper's), or None."""
        self.etcd, self.job, self.ttl = etcd, job, ttl
        self.fence = fence
        self.keeper: LeaseKeeper | None = None
        self.publisher = Publisher(etcd, job, self._lost)
        self.recording: Recorder | None = None  # node 0's Conductor, as its server sees it
        self._excused = excused

    def _excuse(self) -> str | None:
        why = self._excused() if self._excused is not None else None
        if why is not None:
            self.publisher.stop()  # no record to write where no node could read it
        return why

    def _lost(self, why: str) -> None:
        if self.keeper is not None and self.keeper.fenced is None:
            self.keeper.stop()
            self.keeper.fenced = why
        self.fence(why)

    def _keeper(self) -> LeaseKeeper:
        margin = min(MARGIN, self.ttl / 3)
        return LeaseKeeper.grant(self.etcd, self.ttl, self._lost, margin, self._excuse)

    def hold(self, me: Holder) -> Holder | None:
        """Take the seat as node 0 (at the first `go`): this node's term, or None when another
        holds it still (a job of the same id whose node 0's lease has not ended)."""
        keeper = self._keeper()
        holder = election.campaign(self.etcd, self.job, me, keeper.lease)
        if holder.member != me.member or holder.host != me.host:
            if election.wait_vacant(self.etcd, self.job, SEAT_WAIT):
                holder = election.campaign(self.etcd, self.job, me, keeper.lease)
        if holder.member != me.member or holder.host != me.host:
            keeper.stop(revoke=True)
            return None
        self.keeper = keeper
        # An earlier run's record under the same job id is not this job's: gone before a
        # survivor could take it for node 0's (this job's own comes at the next tick).
        self.etcd.delete(election.state_key(self.job))
        self.publisher.hold(holder)
        return holder

    def recorder(self, token_digest: str) -> Callable[[Conductor], Recorder]:
        def record(conductor: Conductor) -> Recorder:
            self.recording = Recorder(conductor, self.publisher, token_digest)
            return self.recording

        return record

    def take_over(self, lost: Node0Lost, me: Holder, roster: Roster, gone: int) -> Election:
        """After node 0 (member `gone`) was lost: the record, the check that the job can go on,
        the wait for the seat, the campaign; or, when another survivor has taken the seat
        already (it saw the loss first), that survivor, joined as it is. Raises NodeExit (75,
        why) when the job cannot go on here."""
        if not roster.elastic:  # node 0 holds no seat then, and writes no record
            raise NodeExit(
                EXIT_PEERS, f"{lost.reason}; the job cannot go on without it: {NOT_ELASTIC}"
            )
        try:
            state = election.read_state(self.etcd, self.job)
            held = election.holder(self.etcd, self.job)
        except EtcdError as err:
            raise NodeExit(EXIT_PEERS, f"{lost.reason}; etcd cannot say who takes over: {err}")
        record = _record(lost, state, me.member)
        alive = frozenset(range(roster.members)) - {gone} - set(record.lost)
        # the record of the node 0 lost, or already its successor's (one restart on)
        restart = record.generation + (1 if record.head == gone else 0)
        if held is not None and held.member not in (gone, me.member):
            return Election(held, record, alive, None, restart)
        why = cannot_go_on(roster, record, me.member, alive)
        if why is not None:
            raise NodeExit(EXIT_PEERS, f"{lost.reason}; the job cannot go on without it: {why}")
        try:
            if lost.hung_up and held is not None and held.member == gone:
                held = self._hung_up(held.term, me.member, alive)
                if held is not None and held.member not in (gone, me.member):
                    return Election(held, record, alive, None, restart)  # another was quicker
            if not election.wait_vacant(self.etcd, self.job, SEAT_WAIT):
                held = election.holder(self.etcd, self.job)
                if held is not None and held.member == gone:
                    raise NodeExit(
                        EXIT_PEERS,
                        f"{lost.reason}; node 0 still holds its seat in etcd {SEAT_WAIT:g} s "
                        "later: it is alive, and this node cannot reach it (a network between "
                        "them)",
                    )
            # Node 0 may have gone on without this node while it waited (this node was the one
            # cut off), and then ended the job and freed the seat: read again before campaigning.
            _record(lost, election.read_state(self.etcd, self.job), me.member)
            keeper = self._keeper()
            holder = election.campaign(self.etcd, self.job, me, keeper.lease)
        except EtcdError as err:
            raise NodeExit(EXIT_PEERS, f"{lost.reason}; etcd cannot say who takes over: {err}")
        if (holder.member, holder.host) == (me.member, me.host):
            self.keeper = keeper
            self.publisher.hold(holder)
            try:
                election.forget_hangups(self.etcd, self.job)
            except EtcdError:
                pass  # a few bytes under a term that has ended
            return Election(holder, record, alive, keeper, restart)
        keeper.stop(revoke=True)
        return Election(holder, record, alive, None, restart)

    def _hung_up(self, term: int, me: int, alive: frozenset[int]) -> Holder | None:
        """Node 0 of `term` hung up on this node: said in etcd. Once every member alive has said
        so, within HANGUP_WAIT, node 0's process has ended (only its end closes every
        connection without a word; a node 0 that stops serving so has fenced, its trainers
        killed; a cut network or a paused node 0 closes nothing), and the lowest member alive
        ends its lease now, not at its TTL (one node reads the others' word: etcd answers one
        reader, not thousands). Short of that, the lease ends by itself. The seat's holder
        then (None: free)."""
        deadline = time.monotonic() + HANGUP_WAIT + HANGUP_WAIT_PER_MEMBER * len(alive)
        election.hang_up(self.etcd, self.job, term, me)
        if me == min(alive):
            while not alive <= election.hung_up_on(self.etcd, self.job, term):
                held = election.holder(self.etcd, self.job)
                if held is None or held.term != term or time.monotonic() >= deadline:
                    return held  # free already, taken, or not every member heard node 0 end
                time.sleep(HANGUP_POLL)
            election.depose(self.etcd, self.job, term)
        return election.holder(self.etcd, self.job)

    def close(self, revoke: bool = True) -> None:
        """The job's end: the seat freed at once (a later job of the same id takes it); not
        `revoke`: left to its lease (the job's own etcd, which ends with the job)."""
        self.publisher.stop()
        if self.keeper is not None:
            self.keeper.stop(revoke=revoke)
            self.keeper = None
