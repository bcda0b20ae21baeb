"""This node's side of the job's own etcd (consensus/embedded.py), which holds node 0's seat when
no ENTRYPOINT_ETCD is named: where every node finds it once node 0's first `go` names its
members; this node's member, when node 0 chose this node; node 0's wait for its quorum, its
closing to strangers and its seat. The supervisor owns one when the job runs its own etcd
(supervise/supervisor.py).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from entrypoint.consensus import embedded
from entrypoint.consensus.etcd import Etcd, EtcdError
from entrypoint.plan.settings import PREFIX, Settings
from entrypoint.supervise import procs
from entrypoint.supervise.logs import Logger
from entrypoint.supervise.node_state import NodeState

READY = 30.0  # seconds node 0 waits for a quorum of the members to answer


class OwnEtcd:
    """The job's own etcd, as this node sees it: `etcd` (the seat's client) learns its
    endpoints at `start`; `members` are the job's members that run one."""

    def __init__(
        self, settings: Settings, node: NodeState, etcd: Etcd, job: str, log: Callable[[], Logger]
    ) -> None:
        """`log`: the node's logger as it is now (it speaks as node 0 once it takes over)."""
        self.settings, self.node, self.etcd, self.job = settings, node, etcd, job
        self._log = log
        self.members: tuple[int, ...] = ()
        self.member: embedded.Embedded | None = None  # this node's, if node 0 chose it

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.member.proc if self.member is not None else None

    def start(self, entries: tuple[str, ...], control_port: int) -> None:
        """From join, at the first `go` that names the job's own etcd: where every node finds
        it, and this node's member of it when node 0 chose this node. With a job token, every
        node speaks to it over TLS, with a certificate of its own the job's CA signed."""
        if self.etcd.endpoints:
            return
        base = embedded.base_port(self.settings.etcd_port, control_port)
        token = self.node.identity.token
        self.members, cluster = embedded.chosen(entries, base, secure=bool(token))
        ends = [(m.host, m.client_port) for m in cluster]
        # A node started again (its first `go` a restart's) runs no member: its old member's
        # data is gone, and a member back with none could undo what the others agreed.
        mine = None
        if self.node.member in self.members and self.node.generation == 0:
            mine = cluster[self.members.index(self.node.member)]
            ends.insert(0, ends.pop(cluster.index(mine)))  # its own member first
        tls = None
        if token:
            self.etcd.credentials(embedded.USER, embedded.password(token))
            try:
                tls = self._tls(token, mine, cluster)
            except OSError as err:
                self._log().warning(f"the job's etcd: this node's certificate failed: {err}")
                return  # no endpoints: this node cannot take node 0's seat
            self.etcd.tls = embedded.client_context(tls)
        if mine is not None:
            self._start_member(mine, cluster, tls)
        self.etcd.endpoints = ends

    def _tls(
        self,
        token: str | bytes,
        mine: embedded.EtcdMember | None,
        cluster: tuple[embedded.EtcdMember, ...],
    ) -> embedded.JobTLS:
        """This node's certificate: its member's, naming the member's host and the addresses
        it reaches the others from, or a client's."""
        where = Path(self.settings.run_dir) / f"node{self.node.member}" / "etcd-tls"
        if mine is None:
            return embedded.job_tls(where, token, f"node{self.node.member}", ())
        hosts = [mine.host, *embedded.sources(cluster, mine)]
        return embedded.job_tls(where, token, mine.name, hosts)

    def _start_member(
        self,
        me: embedded.EtcdMember,
        cluster: tuple[embedded.EtcdMember, ...],
        tls: embedded.JobTLS | None,
    ) -> None:
        """With a token, its ports speak TLS keyed from it (without one, the warning at the
        start says etcd admits whoever reaches its ports)."""
        data = Path(self.settings.run_dir) / f"node{self.node.member}" / "etcd"
        shutil.rmtree(data, ignore_errors=True)  # an earlier job's: never this cluster's
        data.mkdir(parents=True)
        try:
            member = embedded.Embedded(
                me,
                cluster,
                data,
                self.job,
                data.parent / "etcd.log",
                wrap=procs.dying_with_this,
                tls=tls,
            )
            member.start()
        except OSError as err:
            self._log().warning(f"the job's etcd: member {me.name} did not start: {err}")
            return
        self.member = member
        self._log().info(
            f"started member {me.name} of the job's etcd ({len(cluster)} members): "
            f"clients at {me.client_url}, peers at {me.peer_url}",
            log=str(member.log),
        )

    def hold_seat(self, take: Callable[[], str | None], line: str) -> None:
        """Node 0, from a thread of its own (its trainers do not wait): once the members answer
        (a quorum started), etcd closed to anyone without the job's token, then the seat
        (`take`: None, or why not); `line`, what losing node 0 costs, said once it holds."""
        token = self.node.identity.token
        try:
            embedded.wait_ready(self.etcd, READY)
            if token:
                embedded.secure(self.etcd, token)
        except EtcdError as err:
            why: str | None = f"it did not answer in {READY:g} s: {err}"
        else:
            why = take()
        if why is not None:
            self._log().warning(f"losing node 0 ends this job: the job's own etcd failed ({why})")
            return
        if not token:
            line = f"{line}. Its etcd admits whoever reaches its ports: set {PREFIX}JOB_TOKEN"
        self._log().info(line)

    def quorum_lost(self, gone: set[int]) -> str | None:
        """Why no node could take node 0's seat, once the members whose nodes ended (`gone`)
        leave fewer than etcd's quorum; None while a quorum is left."""
        left = [m for m in self.members if m not in gone]
        if not self.members or len(left) > len(self.members) // 2:
            return None
        lost = ", ".join(str(m) for m in self.members if m in gone)
        return (
            f"the job's etcd lost {len(self.members) - len(left)} of its {len(self.members)} "
            f"members with their nodes ({lost}), so no node can take node 0's seat: the job "
            "goes on, and losing node 0 ends it from now on"
        )

    def stop(self) -> None:
        if self.member is not None:
            self.member.stop()
