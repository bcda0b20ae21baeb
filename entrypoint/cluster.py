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

Faults for the failure tests: `run(nodes, faults=[Fault(...)])` carries out an action while it
collects (kill with a signal, `docker stop`, pause, unpause, disconnect from the network, exec),
at a time, once a node's log shows a line, or once a node has exited, and records when it fired;
`Cluster(shared=PATH)` mounts one named volume at PATH in every node (writable by uid 1000),
as a shared filesystem is on a real cluster, so that a second `run` of the same nodes resumes.
`Cluster(mounts={HOST_DIR: PATH})` shows a directory of this machine (a user's code) read-only
at PATH in every node.
"""

from __future__ import annotations

import io
import json
import secrets
import signal
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    import docker

# Where the built-in job writes when ENTRYPOINT_JOB_OUTPUT is unset (entrypoint/job/common.py).
DEFAULT_OUTPUT = "/tmp/entrypoint-job"
LABEL = "io.multinode.cluster"  # on every container and network: `docker ps -a --filter label=...`


class ClusterFailed(AssertionError):
    """A node exited non-zero, or the cluster ran past its deadline; the message has the logs."""


@dataclass(frozen=True)
class Node:
    """One machine: its name (container name = hostname = DNS name on the network), the
    environment its platform gives it, and how long after the cluster's start it boots."""
    name: str
    env: Mapping[str, str]
    delay: float = 0.0
    command: Sequence[str] | None = None  # None: the image's default (`run`, the built-in job)
    gpus: Sequence[str] = ()  # this machine's GPU indices the node gets (a Docker device request)


@dataclass(frozen=True)
class Fault:
    """Something done to the cluster while `run` collects, once: `action(cluster)` (e.g.
    `lambda c: c.kill(name)`), run in its own thread so that a slow one (`docker stop -t`)
    does not hold up the collecting. It fires `delay` seconds after the first of its triggers
    that is set: `at` seconds after the cluster's start, a line containing `line` in the log of
    node `node`, or node `exited` having exited."""
    name: str
    action: Callable[[Cluster], object]
    at: float | None = None
    node: str | None = None
    line: str | None = None
    exited: str | None = None
    delay: float = 0.0


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
        return next((t for line, t in zip(self.lines, self.times, strict=False) if text in line),
                    None)

    def log(self) -> str:
        return "\n".join(self.lines)


@dataclass
class ClusterRun:
    nodes: list[NodeRun]
    lines: list[str]  # every node's log, "[name] line", in arrival order
    seconds: float
    timed_out: bool
    killed_after_failure: list[str]
    faults: dict[str, float] = field(default_factory=dict)  # name: seconds after the start
    fault_errors: dict[str, str] = field(default_factory=dict)  # name: what the action raised

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
        lines = self.lines if tail is None else self.lines[len(self.lines) - tail:]
        return "\n".join(lines)

    def problem(self) -> str | None:
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s; exit codes {self.exit_codes}"
        if any(code != 0 for code in self.exit_codes.values()):
            extra = (f" (killed {', '.join(self.killed_after_failure)} after another node failed)"
                     if self.killed_after_failure else "")
            return f"exit codes {self.exit_codes}{extra}"
        return None

    def check(self, tail: int = 200) -> ClusterRun:
        problem = self.problem()
        if problem:
            raise ClusterFailed(f"cluster failed: {problem}\n--- last {tail} log lines ---\n"
                                f"{self.log(tail)}")
        return self


class Cluster:
    """A private network and the node containers on it; a context manager that removes both."""

    def __init__(self, image: str, *, prefix: str | None = None, shm_size: str = "1g",
                 echo: Callable[[str], None] | None = None,
                 client: docker.DockerClient | None = None,
                 output: str = DEFAULT_OUTPUT, shared: str | None = None,
                 mounts: Mapping[str, str] | None = None):
        self.image = image
        self.output = output  # the job's ENTRYPOINT_JOB_OUTPUT in the nodes: results/ is there
        # Unique per cluster, so that concurrent runs (CI, several developers) never collide.
        self.prefix = prefix or f"mn{secrets.token_hex(3)}"
        self.network_name = f"{self.prefix}-net"
        self.shm_size = shm_size
        self.echo = echo
        self.client = client or sdk().from_env(timeout=120)
        self.network = None
        self.shared = shared  # where every node mounts the one volume, or None
        self.volume_name = f"{self.prefix}-shared"
        self.volume = None
        self.mounts = dict(mounts or {})  # host directory: where every node sees it, read-only
        self.containers: dict[str, object] = {}
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._old_sigterm = None
        self._t0 = time.monotonic()  # the current run's start, for NodeRun.times

    def hostname(self, role: str, index: int) -> str:
        """`<prefix>-<role>-<index>`, e.g. mn1a2b3c-worker-0 (a Kubeflow pod is <job>-master-0)."""
        return f"{self.prefix}-{role}-{index}"

    # -- lifetime ----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so __exit__ still cleans up.
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            self.network = self.client.networks.create(
                self.network_name, driver="bridge", labels={LABEL: self.prefix},
                check_duplicate=True)
            if self.shared:
                self._make_volume()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove every container and the network; never raises, says what it could not remove."""
        from docker.errors import APIError, NotFound

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
            _remove(f"network {self.network_name}", self.network.remove)
            self.network = None
        if self.volume is not None:
            _remove(f"volume {self.volume_name}", lambda: self.volume.remove(force=True))
            self.volume = None
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    # -- running -----------------------------------------------------------------------------

    def run(self, nodes: Sequence[Node], *, timeout: float = 300, grace: float = 20,
            poll: float = 0.5, faults: Sequence[Fault] = ()) -> ClusterRun:
        """Start the nodes (each at its delay), wait until all have exited, collect their logs
        and results. At `timeout` seconds every node still running is killed; once a node has
        failed the others get `grace` seconds to fail too, then are killed (a worker whose peer
        died would otherwise wait for it until torch's own timeouts, many minutes). `faults`
        are carried out as their triggers come (see Fault). Running the same nodes again (a
        restart) replaces their old containers."""
        if self.network is None:
            raise RuntimeError("use Cluster as a context manager: `with Cluster(image) as c:`")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique: {names}")
        runs = {n.name: NodeRun(n.name) for n in nodes}
        for node in nodes:  # created up front: a bad option fails before anything runs
            self._remove(node.name)
            self.containers[node.name] = self._create(node)
        threads: list[threading.Thread] = []
        pending = sorted(nodes, key=lambda n: n.delay)
        waiting = list(faults)
        fired: dict[str, float] = {}
        errors: dict[str, str] = {}
        triggered: dict[str, float] = {}  # fault name: when its trigger came
        running: set[str] = set()
        with self._lock:
            first_line = len(self._lines)
        start = self._t0 = time.monotonic()
        failed_at: float | None = None
        timed_out = False
        killed: list[str] = []
        while pending or running:
            now = time.monotonic() - start
            while pending and pending[0].delay <= now:
                node = pending.pop(0)
                container = self.containers[node.name]
                container.start()
                runs[node.name].started = now
                running.add(node.name)
                self._say(node.name, f"started (at {now:.1f} s)")
                thread = threading.Thread(target=self._follow, daemon=True,
                                          args=(node.name, container, runs[node.name]))
                thread.start()
                threads.append(thread)
            for name in sorted(running):
                container = self.containers[name]
                container.reload()
                if container.status in ("exited", "dead"):
                    code = container.attrs["State"]["ExitCode"]
                    runs[name].exit_code, runs[name].ended = code, now
                    running.discard(name)
                    if code != 0 and failed_at is None:
                        failed_at = now
            for fault in list(waiting):
                if fault.name not in triggered and _triggered(fault, now, runs):
                    triggered[fault.name] = now
                if fault.name in triggered and now >= triggered[fault.name] + fault.delay:
                    waiting.remove(fault)
                    fired[fault.name] = time.monotonic() - start
                    self._say("cluster", f"fault {fault.name} (at {fired[fault.name]:.1f} s)")
                    threading.Thread(target=self._carry_out, args=(fault, errors),
                                     daemon=True, name=f"fault-{fault.name}").start()
            if now > timeout:
                timed_out = True
            if timed_out or (failed_at is not None and now > failed_at + grace):
                for name in sorted(running):
                    self._kill(name)
                    killed.append(name)
                    why = (f"ran past the {timeout:.0f} s deadline" if timed_out
                           else f"still running {grace:.0f} s after another node failed")
                    self._say(name, f"killed: {why}")
                for node in pending:  # never started: counts as failed, exit code None
                    self._say(node.name, "never started")
                break
            time.sleep(poll)
        for thread in threads:
            thread.join(timeout=10)
        for name, node_run in runs.items():
            if node_run.started is not None:
                node_run.results = self._results(name, self.output)
        seconds = time.monotonic() - start
        with self._lock:
            lines = self._lines[first_line:]
        return ClusterRun(nodes=[runs[n.name] for n in nodes], lines=lines, seconds=seconds,
                          timed_out=timed_out, killed_after_failure=[] if timed_out else killed,
                          faults=fired, fault_errors=errors)

    def start(self, node: Node) -> NodeRun:
        """Create and start one long-running node container (daemons, driven with exec), its
        log streamed like the others'; `close()` removes it with the rest."""
        if self.network is None:
            raise RuntimeError("use Cluster as a context manager: `with Cluster(image) as c:`")
        container = self.containers[node.name] = self._create(node)
        node_run = NodeRun(node.name, started=0.0)
        container.start()
        threading.Thread(target=self._follow, daemon=True,
                         args=(node.name, container, node_run)).start()
        return node_run

    def _create(self, node: Node):
        # Explicit device ids: each node sees only its own GPUs, numbered from 0 inside.
        gpus = ([sdk().types.DeviceRequest(device_ids=list(node.gpus), capabilities=[["gpu"]])]
                if node.gpus else None)
        return self.client.containers.create(
            self.image, command=list(node.command) if node.command is not None else None,
            name=node.name, hostname=node.name, network=self.network_name,
            environment=dict(node.env), shm_size=self.shm_size, labels={LABEL: self.prefix},
            device_requests=gpus, detach=True, volumes=self._volumes() or None)

    def _volumes(self) -> dict[str, dict[str, str]]:
        volumes = {host: {"bind": inside, "mode": "ro"} for host, inside in self.mounts.items()}
        if self.shared:
            volumes[self.volume_name] = {"bind": self.shared, "mode": "rw"}
        return volumes

    def _make_volume(self) -> None:
        self.volume = self.client.volumes.create(self.volume_name, labels={LABEL: self.prefix})
        # A new volume's root belongs to root; the nodes run as uid 1000 (the image's user).
        self.client.containers.run(
            self.image, entrypoint=["chown", "1000:0", self.shared], user="0", remove=True,
            volumes={self.volume_name: {"bind": self.shared, "mode": "rw"}},
            labels={LABEL: self.prefix})

    def _remove(self, name: str) -> None:
        """Remove an earlier container of this name (the node's previous run)."""
        from docker.errors import NotFound

        container = self.containers.pop(name, None)
        if container is not None:
            try:
                container.remove(force=True, v=True)
            except NotFound:
                pass

    # -- faults: what `Fault` actions call -----------------------------------------------------

    def kill(self, name: str, signal: str = "SIGKILL") -> None:
        """`docker kill --signal SIGNAL`: to the container's PID 1 (tini passes it on)."""
        self.containers[name].kill(signal=signal)

    def stop(self, name: str, timeout: float) -> None:
        """`docker stop -t TIMEOUT`, as Kubernetes ends a pod: SIGTERM, then SIGKILL after
        TIMEOUT seconds (its terminationGracePeriodSeconds). Returns once it stopped."""
        self.containers[name].stop(timeout=int(timeout))

    def pause(self, name: str) -> None:
        """`docker pause`: every process frozen, sockets open (a hung or swapped-out node)."""
        self.containers[name].pause()

    def unpause(self, name: str) -> None:
        self.containers[name].unpause()

    def disconnect(self, name: str) -> None:
        """`docker network disconnect`: the node is cut off, its connections never close."""
        self.network.disconnect(self.containers[name], force=True)

    def exec(self, name: str, command: Sequence[str], user: str | None = None) -> tuple[int, str]:
        """`docker exec`: (exit code, output)."""
        code, output = self.containers[name].exec_run(list(command), user=user or "")
        return code, output.decode(errors="replace")

    def _carry_out(self, fault: Fault, errors: dict[str, str]) -> None:
        try:
            fault.action(self)
        except Exception as err:  # noqa: BLE001 - reported in ClusterRun.fault_errors
            errors[fault.name] = f"{type(err).__name__}: {err}"
            self._say("cluster", f"fault {fault.name} failed: {err}")

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
        if self.echo is not None:
            self.echo(text)

    def _follow(self, name: str, container, node_run: NodeRun) -> None:
        """Stream one container's stdout and stderr, line by line (a progress bar's carriage
        returns end a line too)."""
        from docker.errors import APIError, NotFound

        buffer = b""
        try:
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
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
        """The rank<R>.json files this node's workers wrote, read from the stopped container
        (with a shared output, the ones whose `node` is this node's name)."""
        found = read_results(self.containers[name], output)
        return [r for r in found if r.get("node", name) == name] if self.shared else found


def read_results(container, output: str = DEFAULT_OUTPUT) -> list[dict]:
    """The rank<R>.json files in <output>/results of a container (running or stopped), read
    through the Docker API, so no host directory or uid has to match."""
    from docker.errors import APIError, NotFound

    try:
        stream, _ = container.get_archive(f"{output}/results")
    except (NotFound, APIError):
        return []  # no results directory: the job never got that far
    data = io.BytesIO(b"".join(stream))
    found = []
    with tarfile.open(fileobj=data) as tar:
        for member in tar.getmembers():
            base = member.name.rsplit("/", 1)[-1]
            if member.isfile() and base.startswith("rank") and base.endswith(".json"):
                found.append(json.loads(tar.extractfile(member).read()))
    return found


def _triggered(fault: Fault, now: float, runs: Mapping[str, NodeRun]) -> bool:
    if fault.at is not None and now >= fault.at:
        return True
    if fault.line is not None:
        lines = runs[fault.node].lines if fault.node in runs else []
        if any(fault.line in line for line in list(lines)):
            return True
    return fault.exited is not None and fault.exited in runs and \
        runs[fault.exited].exit_code is not None


def _remove(what: str, remove: Callable[[], None]) -> None:
    """Remove one Docker object; gone already is fine, anything else is said, never raised."""
    from docker.errors import APIError, NotFound

    try:
        remove()
    except NotFound:
        pass
    except APIError as err:
        print(f"cluster: could not remove {what}: {err}", file=sys.stderr)


def sdk():
    """The Docker SDK, or a one-line error saying how to get it."""
    try:
        import docker
    except ImportError:
        from entrypoint.errors import ConfigError

        raise ConfigError("docker", None, "the Docker SDK for Python is not installed",
                          "pip install 'multinode-entrypoint[local]' (or pip install docker)") from None
    return docker


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
