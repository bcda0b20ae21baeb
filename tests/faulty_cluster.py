"""The cluster helper of the failure tests: entrypoint.local.cluster.Cluster, plus what only tests
use.

Faults: `run(nodes, faults=[Fault(...)])` carries out an action while it collects (kill with a
signal, `docker stop`, pause, unpause, disconnect from the network, exec), at a time, once a
node's log shows a line, or once a node has exited, and records when it fired (FaultyRun.faults).
`FaultyCluster(shared=PATH)` mounts one named volume at PATH in every node (writable by uid
1000), as a shared filesystem is on a real cluster, so that a second `run` of the same nodes
resumes. `FaultyCluster(mounts={HOST_DIR: PATH})` shows a directory of this machine (a user's
code) read-only at PATH in every node.

    with FaultyCluster("multinode:dev", shared="/shared") as cluster:
        run = cluster.run(nodes, faults=[Fault("kill", lambda c: c.kill(name), at=30)])
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from entrypoint.local.cluster import Cluster, ClusterRun, Node, NodeRun


@dataclass(frozen=True)
class Fault:
    """Something done to the cluster while `run` collects, once: `action(cluster)` (e.g.
    `lambda c: c.kill(name)`), run in its own thread so that a slow one (`docker stop -t`)
    does not hold up the collecting. It fires `delay` seconds after the first of its triggers
    that is set: `at` seconds after the cluster's start, a line containing `line` in the log of
    node `node`, or node `exited` having exited."""

    name: str
    action: Callable[[FaultyCluster], object]
    at: float | None = None
    node: str | None = None
    line: str | None = None
    exited: str | None = None
    delay: float = 0.0


@dataclass
class FaultyRun(ClusterRun):
    faults: dict[str, float] = field(default_factory=dict)  # name: seconds after the start
    fault_errors: dict[str, str] = field(default_factory=dict)  # name: what the action raised


class FaultyCluster(Cluster):
    """A Cluster that carries out faults while it runs, with an optional shared volume and
    read-only host directories in every node."""

    def __init__(
        self,
        image: str,
        *,
        shared: str | None = None,
        mounts: Mapping[str, str] | None = None,
        **kwargs: Any,
    ):
        super().__init__(image, shared=shared, **kwargs)
        self.mounts = dict(mounts or {})  # host directory: where every node sees it, read-only
        self._waiting: list[Fault] = []
        self._triggered: dict[str, float] = {}  # fault name: when its trigger came
        self._fired: dict[str, float] = {}
        self._errors: dict[str, str] = {}
        self.live: Mapping[str, NodeRun] = {}  # the current run's nodes so far, for an action
        self._again: list[tuple[str, float]] = []  # nodes started again, and since when

    def run(
        self, nodes: Sequence[Node], *, faults: Sequence[Fault] = (), **kwargs: Any
    ) -> FaultyRun:
        """Cluster.run, carrying out `faults` as their triggers come (see Fault)."""
        self._waiting = list(faults)
        self._triggered, self._fired, self._errors = {}, {}, {}
        run = super().run(nodes, **kwargs)
        # the same dicts: an action still running (a slow `docker stop`) reports into them
        return FaultyRun(**vars(run), faults=self._fired, fault_errors=self._errors)

    def on_poll(self, now: float, runs: Mapping[str, NodeRun]) -> None:
        self.live = runs
        for fault in list(self._waiting):
            if fault.name not in self._triggered and triggered(fault, now, runs):
                self._triggered[fault.name] = now
            if fault.name in self._triggered and now >= self._triggered[fault.name] + fault.delay:
                self._waiting.remove(fault)
                self._fired[fault.name] = time.monotonic() - self._t0
                self._say("cluster", f"fault {fault.name} (at {self._fired[fault.name]:.1f} s)")
                threading.Thread(
                    target=self._carry_out,
                    args=(fault, self._errors),
                    daemon=True,
                    name=f"fault-{fault.name}",
                ).start()

    def _volumes(self) -> dict[str, dict[str, str]]:
        volumes = {host: {"bind": inside, "mode": "ro"} for host, inside in self.mounts.items()}
        return volumes | super()._volumes()

    # -- what `Fault` actions call --------------------------------------------------------------

    def seconds(self) -> float:
        """Seconds since the current run's start (the clock of NodeRun.times and faults)."""
        return time.monotonic() - self._t0

    def fired(self, name: str) -> float | None:
        """When the fault `name` fired in the current run, if it did."""
        return self._fired.get(name)

    def kill(self, name: str, signal: str = "SIGKILL") -> None:
        """`docker kill --signal SIGNAL`: to the container's PID 1 (tini passes it on)."""
        self.containers[name].kill(signal=signal)

    def stop(self, name: str, timeout: float) -> None:
        """`docker stop -t TIMEOUT`, as Kubernetes ends a pod: SIGTERM, then SIGKILL after
        TIMEOUT seconds (its terminationGracePeriodSeconds). Returns once it stopped."""
        self.containers[name].stop(timeout=int(timeout))

    def pause(self, name: str) -> None:
        """`docker pause`: every process frozen, sockets open (a hung or swapped-out node).
        runc gives up freezing a cgroup whose processes keep changing under it ("unable to
        freeze", seen once in CI's run beside 3 other tests): the pause is tried again, as
        whoever pauses a node would."""
        from docker.errors import APIError

        for attempt in range(5):
            try:
                self.containers[name].pause()
                return
            except APIError as err:
                if "unable to freeze" not in str(err) or attempt == 4:
                    raise
                time.sleep(0.2)

    def unpause(self, name: str) -> None:
        self.containers[name].unpause()

    def start_again(self, name: str) -> None:
        """`docker start` of a node's exited container, as a platform starts a failed node again
        (its name, address and options kept): the run follows it anew, its exit code the new
        start's, its log the old one's and the new one's."""
        since = time.time()
        self.containers[name].start()
        self._again.append((name, since))

    def _read_exits(self, state: Any, runs: dict[str, NodeRun], now: float) -> None:
        while self._again:
            name, since = self._again.pop(0)
            runs[name].exit_code = None
            state.running.add(name)
            thread = threading.Thread(
                target=self._follow,
                args=(name, self.containers[name], runs[name], since),
                daemon=True,
            )
            thread.start()
            state.threads.append(thread)
        super()._read_exits(state, runs, now)

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
        except Exception as err:  # noqa: BLE001 - reported in FaultyRun.fault_errors
            errors[fault.name] = f"{type(err).__name__}: {err}"
            self._say("cluster", f"fault {fault.name} failed: {err}")


def hand_started(c: FaultyCluster, steps: int, **env: str) -> list[Node]:
    """Two nodes started by hand (NNODES/NODE_RANK, tests/cluster/test_cluster.py's torchrun
    style), 2 CPU workers each, running the built-in job for `steps` steps, plus `env`."""
    job = {"ENTRYPOINT_JOB_STEPS": str(steps), "ENTRYPOINT_JOB_LOG_EVERY": "5"}
    return two_nodes(c, c.hostname("node", 0), **(job | env))


# tests/fault_trainer.py as every node of a FaultyCluster(mounts=LIGHT_MOUNT) sees it
LIGHT_MOUNT = {str(Path(__file__).parent): "/tests"}
LIGHT = ["run", "--", "python", "/tests/fault_trainer.py"]
JOB_KNOBS = ("ENTRYPOINT_JOB_STEPS", "ENTRYPOINT_JOB_LOG_EVERY", "ENTRYPOINT_JOB_SAVE_EVERY")
# Each node's one trainer process started by the entrypoint itself (its `jax` launcher), no
# torchrun, which imports torch on every node: for the cases whose subject is the entrypoint's
# own handling (a lost node, the control channel), not torchrun's of its workers (as
# tests/unit/test_supervise_real.py's ONE_PER_NODE; docs/testing.md says what still runs it).
ONE_PER_NODE = {"ENTRYPOINT_LAUNCHER": "jax", "ENTRYPOINT_NPROC_PER_NODE": "1"}


def light_started(
    c: FaultyCluster, steps: int, *, pace: float = 0.05, master: str | None = None, **env: str
) -> list[Node]:
    """hand_started's two nodes, lightened (below)."""
    return lightened(two_nodes(c, master or c.hostname("node", 0), **env), steps, pace=pace)


def lightened(
    nodes: Sequence[Node], steps: int, *, pace: float = 0.05, out: str = "/tmp/fault"
) -> list[Node]:
    """The same nodes, their workers running tests/fault_trainer.py (steps of `pace` seconds in
    lockstep, over TCP; rank 0 prints `[fault] step N/STEPS` every 5) instead of the built-in
    job: for the tests whose subject is the entrypoint, not the trainer. Its workers import
    neither torch nor DeepSpeed (a 2-node case's CPU: about a third of the built-in job's).
    Its checkpoint and reports go to `out` (an output's `results` folder: read as the built-in
    job's reports are, a shared one: resumed by a spare). The cluster needs
    `mounts=LIGHT_MOUNT`."""
    trainer = {
        "FAULT_OUT": out,
        "FAULT_PORT": "29510",
        "FAULT_STEPS": str(steps),
        "FAULT_STEP_SECONDS": str(pace),
        "FAULT_SAY_EVERY": "5",
    }
    return [
        replace(
            n,
            env={k: v for k, v in n.env.items() if k not in JOB_KNOBS} | trainer,
            command=LIGHT,
        )
        for n in nodes
    ]


def two_nodes(c: FaultyCluster, master: str, **env: str) -> list[Node]:
    """Two nodes started by hand, 2 CPU workers each, `env` added."""
    return [
        Node(
            c.hostname("node", r),
            {
                "NNODES": "2",
                "NODE_RANK": str(r),
                "MASTER_ADDR": master,
                "MASTER_PORT": "29500",
                "ENTRYPOINT_NPROC_PER_NODE": "2",
            }
            | env,
        )
        for r in (0, 1)
    ]


def triggered(fault: Fault, now: float, runs: Mapping[str, NodeRun]) -> bool:
    """Whether one of `fault`'s triggers has come, `now` seconds after the start."""
    if fault.at is not None and now >= fault.at:
        return True
    if fault.line is not None:
        lines = runs[fault.node].lines if fault.node in runs else []
        if any(fault.line in line for line in list(lines)):
            return True
    return (
        fault.exited is not None
        and fault.exited in runs
        and runs[fault.exited].exit_code is not None
    )
