"""A cluster of node containers on one machine: `entrypoint local`, `make demo` and the cluster
tests share it. Needs the Docker SDK (`pip install 'multinode-entrypoint[local]'`), imported
only when a Cluster is made, so the entrypoint inside the image never loads it.

Each node is a container of the image on a private bridge network, named and hostnamed as the
platform would name the machine, so that the platform's variables (MASTER_ADDR, a SLURM
hostlist, a Kubeflow pod name) resolve as they would there. The helper starts the nodes (each
after its own delay), prints their logs as they come, prefixed by node, waits with a deadline,
and collects what every worker reported (<output>/results/rank<R>.json, read out of the
stopped container, so no host directory or uid has to match). Containers and the network are
always removed: on success, failure, timeout, Ctrl-C and SIGTERM.

    with Cluster("multinode:dev") as cluster:
        a, b = cluster.hostname("worker", 0), cluster.hostname("worker", 1)
        run = cluster.run([Node(a, {...}), Node(b, {...})], timeout=240)
        run.check()  # raises ClusterFailed with every node's log unless all exited 0

The failure tests' machinery (faults carried out while a run collects, a shared volume, a
host directory mounted in every node) is a subclass under tests/ (tests/faulty_cluster.py): it
hooks `Cluster.on_poll`, called once per poll while `run` collects, and `_volumes`.
"""

from __future__ import annotations

import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, Self

from entrypoint.local.cluster_docker import (
    DEFAULT_OUTPUT,
    held_signals,
    read_results,
    remove_quietly,
    sdk,
    sweep,
)
from entrypoint.plan.errors import EntrypointError

if TYPE_CHECKING:
    from types import FrameType

    from docker import DockerClient
    from docker.models.containers import Container

LABEL = "io.multinode.cluster"  # on every container and network: `docker ps -a --filter label=...`


# -- what a cluster is given and gives back -------------------------------------------------------
# What a local cluster is given and gives back: a `Node` (a machine: name, environment, delay),
# each node's `NodeRun` (exit code, log lines and when they came, its workers' reports), and the
# `ClusterRun` that `Cluster.run` returns, whose `check()` raises `ClusterFailed` with the logs.


class ClusterFailed(EntrypointError, AssertionError):
    """A node exited non-zero, or the cluster ran past its deadline; the message has the logs."""

    exit_code = 1


@dataclass(frozen=True)
class Node:
    """One machine: its name (container name = hostname = DNS name on the network), the
    environment its platform gives it, and how long after the cluster's start it boots."""

    name: str
    env: Mapping[str, str]
    delay: float = 0.0
    command: Sequence[str] | None = None  # None: the image's default (`run`, the built-in job)
    gpus: Sequence[str] = ()  # this machine's GPU indices the node gets (a Docker device request)


@dataclass
class NodeRun:
    name: str
    exit_code: int | None = None  # None: never started, or killed at the deadline
    lines: list[str] = field(default_factory=list)
    results: list[dict] = field(default_factory=list)  # this node's workers' reports
    started: float | None = None  # seconds after the cluster's start
    ended: float | None = None
    times: list[float] = field(default_factory=list)  # when each of `lines` arrived, likewise

    def when(self, text: str) -> float | None:
        """Seconds after the cluster's start at which a line containing `text` arrived."""
        return next(
            (t for line, t in zip(self.lines, self.times, strict=False) if text in line), None
        )

    def log(self) -> str:
        return "\n".join(self.lines)


@dataclass
class ClusterRun:
    nodes: list[NodeRun]
    lines: list[str]  # every node's log, "[name] line", in arrival order
    seconds: float
    timed_out: bool
    killed_after_failure: list[str]

    @property
    def exit_codes(self) -> dict[str, int | None]:
        return {n.name: n.exit_code for n in self.nodes}

    def node(self, name: str) -> NodeRun:
        return next(n for n in self.nodes if n.name == name)

    @property
    def results(self) -> list[dict]:
        """Every worker's report across the nodes, by global rank (once, also when the nodes
        share the output directory)."""
        by_rank = {r["rank"]: r for n in self.nodes for r in n.results}
        return [by_rank[rank] for rank in sorted(by_rank)]

    def log(self, tail: int | None = None) -> str:
        lines = self.lines if tail is None else self.lines[len(self.lines) - tail :]
        return "\n".join(lines)

    def problem(self) -> str | None:
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s; exit codes {self.exit_codes}"
        if any(code != 0 for code in self.exit_codes.values()):
            extra = (
                f" (killed {', '.join(self.killed_after_failure)} after another node failed)"
                if self.killed_after_failure
                else ""
            )
            return f"exit codes {self.exit_codes}{extra}"
        return None

    def check(self, tail: int = 200) -> ClusterRun:
        problem = self.problem()
        if problem:
            raise ClusterFailed(
                f"cluster failed: {problem}\n--- last {tail} log lines ---\n{self.log(tail)}"
            )
        return self


@dataclass
class _Collect:
    """What `Cluster.run` tracks while it collects."""

    pending: list[Node]  # by delay
    running: set[str] = field(default_factory=set)
    threads: list[threading.Thread] = field(default_factory=list)
    failed_at: float | None = None
    timed_out: bool = False
    killed: list[str] = field(default_factory=list)


class Cluster:
    """A private network and the node containers on it; a context manager that removes both."""

    def __init__(
        self,
        image: str,
        *,
        prefix: str | None = None,
        shm_size: str = "1g",
        echo: Callable[[str], None] | None = None,
        client: DockerClient | None = None,
        output: str = DEFAULT_OUTPUT,
        shared: str | None = None,
    ) -> None:
        self.image = image
        self.output = output  # the job's ENTRYPOINT_JOB_OUTPUT in the nodes: results/ is there
        # Unique per cluster, so that concurrent runs (CI, several developers) never collide.
        self.prefix = prefix or f"mn{secrets.token_hex(3)}"
        self.network_name = f"{self.prefix}-net"
        self.shm_size = shm_size
        self.echo = echo
        self.client = client or sdk().from_env(timeout=120)
        self.network = None
        self.containers: dict[str, Container] = {}
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._old_sigterm: Callable[[int, FrameType | None], Any] | int | None = None
        self._t0 = time.monotonic()  # the current run's start, for NodeRun.times
        self._closing = False  # close() has begun: the nodes' lines are no longer echoed
        # One volume every node mounts at `shared`, as a cluster's shared filesystem: a job's
        # checkpoints there survive a lost node, and a standby resumes from them.
        self.shared = shared
        self.volume_name = f"{self.prefix}-shared"
        self.volume: Any = None

    def hostname(self, role: str, index: int) -> str:
        """`<prefix>-<role>-<index>`, e.g. mn1a2b3c-worker-0 (a Kubeflow pod is <job>-master-0)."""
        return f"{self.prefix}-{role}-{index}"

    # -- lifetime ----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so __exit__ still cleans up.
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            with held_signals():
                self.network = self.client.networks.create(
                    self.network_name,
                    driver="bridge",
                    labels={LABEL: self.prefix},
                    check_duplicate=True,
                    **self._network_options(),
                )
            if self.shared:
                self._make_volume()
        except BaseException:
            self.close()
            raise
        return self

    def _make_volume(self) -> None:
        assert self.shared is not None
        with held_signals():
            self.volume = self.client.volumes.create(self.volume_name, labels={LABEL: self.prefix})
        # A new volume's root belongs to root; the nodes run as uid 1000 (the image's user).
        with held_signals():
            self.client.containers.run(
                self.image,
                entrypoint=["chown", "1000:0", self.shared],
                user="0",
                remove=True,
                volumes={self.volume_name: {"bind": self.shared, "mode": "rw"}},
                labels={LABEL: self.prefix},
            )

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove every container and the network; never raises, says what it could not remove."""
        from docker.errors import APIError, NotFound

        # What the nodes say while they are removed (a worker whose peer vanished) is noise.
        self._closing = True
        shielded = {}
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                shielded[number] = signal.signal(number, _ignored_while_closing)
        try:
            self._remove_all(APIError, NotFound)
        finally:
            for number, handler in shielded.items():
                signal.signal(number, handler)
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def _remove_all(
        self,
        APIError: type[Exception],  # noqa: N803 - docker's classes
        NotFound: type[Exception],  # noqa: N803
    ) -> None:
        for name, container in list(self.containers.items()):
            try:
                container.reload()
                if container.status == "paused":  # a paused container cannot be killed
                    container.unpause()
                container.remove(force=True, v=True)
            except NotFound:
                pass
            except APIError as err:
                print(f"cluster: could not remove container {name}: {err}", file=sys.stderr)
            self.containers.pop(name, None)
        if self.network is not None:
            remove_quietly(f"network {self.network_name}", self.network.remove)
            self.network = None
        if self.volume is not None:
            volume = self.volume
            remove_quietly(f"volume {self.volume_name}", lambda: volume.remove(force=True))
            self.volume = None
        sweep(self.client, f"{LABEL}={self.prefix}")

    # -- running -----------------------------------------------------------------------------

    def run(
        self, nodes: Sequence[Node], *, timeout: float = 300, grace: float = 20, poll: float = 0.5
    ) -> ClusterRun:
        """Start the nodes (each at its delay), wait until all have exited, collect their logs
        and results. At `timeout` seconds every node still running is killed; once a node has
        failed the others get `grace` seconds to fail too, then are killed (a worker whose peer
        died would otherwise wait for it until torch's own timeouts, many minutes). `on_poll`
        is called once per poll. Running the same nodes again (a restart) replaces their old
        containers."""
        if self.network is None:
            raise RuntimeError("use Cluster as a context manager: `with Cluster(image) as c:`")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique: {names}")
        runs = {n.name: NodeRun(n.name) for n in nodes}
        for node in nodes:  # created up front: a bad option fails before anything runs
            self._remove(node.name)
            with held_signals():
                self.containers[node.name] = self._create(node)
        state = _Collect(pending=sorted(nodes, key=lambda n: n.delay))
        with self._lock:
            first_line = len(self._lines)
        start = self._t0 = time.monotonic()
        while state.pending or state.running:
            now = time.monotonic() - start
            self._start_due(state, runs, now)
            self._read_exits(state, runs, now)
            self.on_poll(now, runs)
            if now > timeout:
                state.timed_out = True
            if state.timed_out or (state.failed_at is not None and now > state.failed_at + grace):
                self._kill_running(state, timeout, grace)
                break
            time.sleep(poll)
        for thread in state.threads:
            thread.join(timeout=10)
        for name, node_run in runs.items():
            if node_run.started is not None:
                node_run.results = self._results(name, self.output)
        seconds = time.monotonic() - start
        with self._lock:
            lines = self._lines[first_line:]
        return ClusterRun(
            nodes=[runs[n.name] for n in nodes],
            lines=lines,
            seconds=seconds,
            timed_out=state.timed_out,
            killed_after_failure=[] if state.timed_out else state.killed,
        )

    def _start_due(self, state: _Collect, runs: dict[str, NodeRun], now: float) -> None:
        """Start the nodes whose delay has passed, each followed by its own log thread."""
        while state.pending and state.pending[0].delay <= now:
            node = state.pending.pop(0)
            container = self.containers[node.name]
            container.start()
            runs[node.name].started = now
            state.running.add(node.name)
            self._say(node.name, f"started (at {now:.1f} s)")
            thread = threading.Thread(
                target=self._follow, daemon=True, args=(node.name, container, runs[node.name])
            )
            thread.start()
            state.threads.append(thread)

    def _read_exits(self, state: _Collect, runs: dict[str, NodeRun], now: float) -> None:
        for name in sorted(state.running):
            container = self.containers[name]
            container.reload()
            if container.status in ("exited", "dead"):
                code = container.attrs["State"]["ExitCode"]
                runs[name].exit_code, runs[name].ended = code, now
                state.running.discard(name)
                if code != 0 and state.failed_at is None:
                    state.failed_at = now

    def _kill_running(self, state: _Collect, timeout: float, grace: float) -> None:
        for name in sorted(state.running):
            self._kill(name)
            state.killed.append(name)
            why = (
                f"ran past the {timeout:.0f} s deadline"
                if state.timed_out
                else f"still running {grace:.0f} s after another node failed"
            )
            self._say(name, f"killed: {why}")
        for node in state.pending:  # never started: counts as failed, exit code None
            self._say(node.name, "never started")

    def on_poll(self, now: float, runs: Mapping[str, NodeRun]) -> None:
        """Called once per poll while `run` collects, after the exits are read: `now` seconds
        after the run's start, `runs` every node's state so far. Nothing here; a subclass (the
        tests' faults) hooks in."""

    def start(self, node: Node) -> NodeRun:
        """Create and start one long-running node container (daemons, driven with exec), its
        log streamed like the others'; `close()` removes it with the rest."""
        if self.network is None:
            raise RuntimeError("use Cluster as a context manager: `with Cluster(image) as c:`")
        with held_signals():
            container = self.containers[node.name] = self._create(node)
        node_run = NodeRun(node.name, started=0.0)
        container.start()
        threading.Thread(
            target=self._follow, daemon=True, args=(node.name, container, node_run)
        ).start()
        return node_run

    def _create(self, node: Node) -> Container:
        # Explicit device ids: each node sees only its own GPUs, numbered from 0 inside.
        gpus = (
            [sdk().types.DeviceRequest(device_ids=list(node.gpus), capabilities=[["gpu"]])]
            if node.gpus
            else None
        )
        return self.client.containers.create(
            self.image,
            command=list(node.command) if node.command is not None else None,
            name=node.name,
            hostname=node.name,
            network=self.network_name,
            environment=dict(node.env),
            shm_size=self.shm_size,
            labels={LABEL: self.prefix},
            device_requests=gpus,
            detach=True,
            volumes=self._volumes() or None,
            **self._container_options(node),
        )

    def _network_options(self) -> dict[str, Any]:
        """More of `docker network create` (an IPv6 subnet, say): nothing here (a subclass adds)."""
        return {}

    def _container_options(self, node: Node) -> dict[str, Any]:
        """More of `docker create` for this node: nothing here (a subclass adds)."""
        return {}

    def _volumes(self) -> dict[str, dict[str, str]]:
        """What every node mounts, as the Docker SDK takes it: the shared volume, if any (a
        subclass adds)."""
        return {self.volume_name: {"bind": self.shared, "mode": "rw"}} if self.shared else {}

    def _remove(self, name: str) -> None:
        """Remove an earlier container of this name (the node's previous run)."""
        from docker.errors import NotFound

        container = self.containers.pop(name, None)
        if container is not None:
            try:
                container.remove(force=True, v=True)
            except NotFound:
                pass

    def _kill(self, name: str) -> None:
        from docker.errors import APIError, NotFound

        try:
            self.containers[name].kill()
        except (NotFound, APIError):
            pass

    def _say(self, name: str, line: str) -> None:
        text = f"[{name}] {line}"
        with self._lock:
            self._lines.append(text)
        if self.echo is not None and not self._closing:
            self.echo(text)

    def _follow(
        self, name: str, container: Container, node_run: NodeRun, since: float | None = None
    ) -> None:
        """Stream one container's stdout and stderr, line by line (a progress bar's carriage
        returns end a line too); `since` (Unix time): only what it wrote from then on (a
        container started again)."""
        from docker.errors import APIError, NotFound

        buffer = b""
        try:
            for chunk in container.logs(
                stream=True, follow=True, stdout=True, stderr=True, since=since
            ):
                buffer += chunk.replace(b"\r", b"\n")
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    if raw.strip():
                        line = raw.decode(errors="replace")
                        node_run.times.append(time.monotonic() - self._t0)
                        node_run.lines.append(line)
                        self._say(name, line)
        except (APIError, NotFound, OSError):
            pass  # the container went away (killed at the deadline): what came is kept
        if buffer.strip():
            line = buffer.decode(errors="replace")
            node_run.times.append(time.monotonic() - self._t0)
            node_run.lines.append(line)
            self._say(name, line)

    def _results(self, name: str, output: str = DEFAULT_OUTPUT) -> list[dict]:
        """The rank<R>.json files this node's workers wrote, read from the stopped container;
        with a shared output, only the reports whose `node` is this node's name."""
        found = read_results(self.containers[name], output)
        return [r for r in found if r.get("node", name) == name] if self.shared else found


def _raise_interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt(signum)


def _ignored_while_closing(signum: int, frame: FrameType | None) -> None:
    """A second Ctrl-C while the containers are removed: the removal goes on."""
