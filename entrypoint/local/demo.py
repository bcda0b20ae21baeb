"""The end of an `entrypoint local` run, and a loss to watch: its verdict and every worker's
report; `--kill NODE@STEP`, a node loss you can watch. The node's container is killed
once node 0's job reaches the step (the built-in job's `step N/` lines, else node 0's
`/metrics`, the fewest steps any rank has made), and at the end one paragraph says what
happened: the loss, who took the rank, when training went on and from which checkpoint."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrypoint.local.cluster import Cluster, ClusterRun, NodeRun
from entrypoint.plan.errors import ConfigError

SHARED = "/shared"  # with spares: one volume every node mounts, for the checkpoints
STEP = re.compile(r"\bstep (\d+)/(\d+)\b")
TAKES = re.compile(r"node (\d+) takes node rank (\d+)")
NEW_HEAD = re.compile(r"node (\d+) \([^)]*\) is node 0 from restart")
RESUMED = re.compile(r"resuming from checkpoint .*\(step (\d+)\)")
JOB_STEPS = re.compile(r"^multinode_job_steps (\S+)$", re.M)


@dataclass(frozen=True)
class Kill:
    node: int
    step: int


def parse_kills(raw: Sequence[str], nodes: int, node0: bool = False) -> list[Kill]:
    """`--kill 1@30` (several allowed): node 1 killed at step 30. Node 0 only where `node0`:
    the job outlives it (spares, 3 containers or more: the job's own etcd elects another)."""
    out = []
    for text in raw:
        node, sep, step = text.partition("@")
        if not sep or not node.isdigit() or not step.isdigit() or int(step) < 1:
            raise ConfigError("--kill", text, "is not NODE@STEP", "Give --kill 1@30")
        if int(node) == 0 and not node0:
            raise ConfigError(
                "--kill",
                text,
                "names node 0, whose loss ends this job",
                "Give --spares 1 and 3 containers or more (--nodes 2 --spares 1), so that a "
                "survivor takes node 0's place, or kill another node: --kill 1@30",
            )
        if not 0 <= int(node) < nodes:
            raise ConfigError(
                "--kill", text, f"names no node of this job (0-{nodes - 1})", "Give --kill 1@30"
            )
        out.append(Kill(int(node), int(step)))
    return sorted(out, key=lambda k: k.step)


@dataclass
class Killed:
    node: int
    name: str
    step: int  # the step node 0 had reached
    at: float  # seconds after the run's start


class KillingCluster(Cluster):
    """A Cluster that kills nodes at steps while it runs (`kills` and `names` set before `run`;
    node i's container is `names[i]`)."""

    def __init__(self, image: str, *, kills: Sequence[Kill] = (), **options: Any) -> None:
        super().__init__(image, **options)
        self.kills = list(kills)
        self.names: list[str] = []
        self.killed: list[Killed] = []
        self.metrics_port = 29502
        self._last_scrape = 0.0

    def on_poll(self, now: float, runs: Mapping[str, NodeRun]) -> None:
        if len(self.killed) == len(self.kills) or not self.names:
            return
        step = self._step(_latest(runs.values(), STEP))
        for kill in self.kills[len(self.killed) :]:
            if step is None or step < kill.step:
                return
            name = self.names[kill.node]
            self._say("local", f"node {kill.node} ({name}) killed at step {step} (--kill)")
            self._kill(name)
            self.killed.append(Killed(kill.node, name, step, now))

    def _step(self, latest: re.Match | None) -> int | None:
        """The job's step: the last `step N/` line of any node (node rank 0's, which a new
        node 0 takes), else node 0's /metrics (each second)."""
        if latest is not None:
            return int(latest.group(1))
        if time.monotonic() - self._last_scrape < 1 or not self.names:
            return None
        self._last_scrape = time.monotonic()
        try:
            address = self._address(self.names[0])
            url = f"http://{address}:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 - http
                found = JOB_STEPS.search(response.read(1 << 22).decode())
        except (OSError, ValueError, KeyError):
            return None
        return int(float(found.group(1))) if found else None

    def _address(self, name: str) -> str:
        container = self.containers[name]
        container.reload()
        network = container.attrs["NetworkSettings"]["Networks"][self.network_name]
        return network["IPAddress"] or f"[{network['GlobalIPv6Address']}]"


def story(run: ClusterRun, killed: Sequence[Killed], names: Sequence[str]) -> list[str]:
    """What happened, one line a loss, from the nodes' own lines (node 0's, a new node 0's, and
    the trainer's)."""
    if not killed:
        return []
    out = []
    for loss in killed:
        parts = [f"node {loss.node} lost at step {loss.step} (killed, {loss.at:.1f} s in)"]
        head = _after(run.nodes, loss.at, NEW_HEAD)
        if head:
            parts.append(f"node {head[1].group(1)} is node 0 from then on")
        took = _after(run.nodes, loss.at, TAKES)
        if took:
            parts.append(f"node {took[1].group(1)} took node rank {took[1].group(2)}")
        resumed = _after(run.nodes, loss.at, RESUMED)
        trained = _after(run.nodes, resumed[0] if resumed else loss.at, STEP)
        if trained:
            where = f", from the step-{resumed[1].group(1)} checkpoint" if resumed else ""
            parts.append(f"training again {trained[0] - loss.at:.1f} s later{where}")
        out.append("local: " + "; ".join(parts))
    last = _latest(run.nodes, STEP)
    if last is not None:
        out.append(f"local: {last.group(1)} of {last.group(2)} steps done")
    return out


def head(run: ClusterRun, names: Sequence[str]) -> str:
    """The node serving the job at its end: node 0, or the survivor that took its seat."""
    found = _latest(run.nodes, NEW_HEAD)
    return names[int(found.group(1))] if found and int(found.group(1)) < len(names) else names[0]


def _after(
    nodes: Iterable[NodeRun], at: float, pattern: re.Pattern
) -> tuple[float, re.Match] | None:
    """The first line of any node, at or after `at`, that `pattern` finds: its time, the match."""
    return min(
        (
            (t, found)
            for node in nodes
            for line, t in zip(node.lines, node.times, strict=False)
            if t >= at and (found := pattern.search(line))
        ),
        key=lambda x: x[0],
        default=None,
    )


def _latest(nodes: Iterable[NodeRun], pattern: re.Pattern) -> re.Match | None:
    """The last line of any node (by when it came) that `pattern` finds."""
    best: tuple[float, re.Match] | None = None
    for node in nodes:
        for line, t in zip(reversed(node.lines[-200:]), reversed(node.times[-200:]), strict=False):
            if found := pattern.search(line):
                if best is None or t > best[0]:
                    best = (t, found)
                break
    return best[1] if best else None


def shared_checkpoints(extra: dict[str, str], steps: int) -> None:
    """With spares, the built-in job runs long enough to kill a node by hand (or for --kill's
    loss, takeover and resume), its checkpoints on a volume every node shares, as on a cluster:
    the next start resumes."""
    extra.setdefault("ENTRYPOINT_JOB_STEPS", str(steps))
    extra.setdefault("ENTRYPOINT_JOB_OUTPUT", f"{SHARED}/job")


def summary(results: list[dict], nnodes: int, seconds: float) -> list[str]:
    """What every worker reported, ending with the final loss (the built-in job's reports)."""
    lines = ["", "local: every worker's report (<output>/results/rank<R>.json):"]
    for r in results:
        writer = "  wrote the checkpoint" if r["checkpoint_writer"] else ""
        lines.append(
            f"  rank {r['rank']} of {r['world_size']} on {r['node']} (node "
            f"{r['node_rank']}, local rank {r['local_rank']}){writer}"
        )
    first = results[0]
    lines.append(
        f"local: {first['job']} on {nnodes} nodes x {len(results) // nnodes} workers, "
        f"{first['steps']} steps in {seconds:.0f} s; final loss {first['final_loss']:.4f} "
        f"(first {first['first_loss']:.4f})"
    )
    return lines


def save_results(results: list[dict], directory: str) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for r in results:
        (out / f"rank{r['rank']}.json").write_text(json.dumps(r, indent=2) + "\n")


def lost_on_the_way(lost: Mapping[str, int | None]) -> str:
    """The nodes a job with spares or a minimum went on without, as a sentence:
    `node local-1a2b-node-1 was lost on the way (exit 137: SIGKILL); the job went on without
    it`."""
    said = [f"{name} ({_exit(code)})" for name, code in sorted(lost.items())]
    if len(said) == 1:
        return f"node {said[0]} was lost on the way; the job went on without it"
    listed = ", ".join(said[:-1]) + f" and {said[-1]}"
    return f"nodes {listed} were lost on the way; the job went on without them"


def _exit(code: int | None) -> str:
    if code is None:
        return "no exit seen"
    try:
        return f"exit {code}" + (f": {signal.Signals(code - 128).name}" if code > 128 else "")
    except ValueError:
        return f"exit {code}"


def verdict(
    run: ClusterRun, results_dir: str | None, command: list[str], elastic: bool, node0: str
) -> int:
    """Save the reports, say how the run went, and its exit code. With spares or a minimum,
    node 0's exit is the job's: a node lost on the way is said, not a failure."""
    if results_dir:
        save_results(run.results, results_dir)
    lost = {name: code for name, code in run.exit_codes.items() if code != 0}
    elastic = elastic and not run.timed_out
    problem = None if elastic and run.exit_codes.get(node0) == 0 else run.problem()
    if elastic and lost and not problem:
        print(f"local: {lost_on_the_way(lost)}")
    if problem:
        print(f"local: FAILED: {problem}", file=sys.stderr)
        return 1
    if command:  # the user's own trainer: its exit codes are the verdict
        print(f"local: every node exited 0 in {run.seconds:.0f} s")
        return 0
    results = run.results
    expected = results[0]["world_size"] if results else 0
    if not results or len(results) != expected:
        print(f"local: FAILED: {len(results)} worker reports, expected {expected}", file=sys.stderr)
        return 1
    nodes = len({r["node_rank"] for r in results})
    for line in summary(results, nodes, run.seconds):
        print(line)
    return 0
