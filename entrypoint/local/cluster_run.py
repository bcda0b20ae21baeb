"""What a local cluster is given and gives back: a `Node` (a machine: name, environment, delay),
each node's `NodeRun` (exit code, log lines and when they came, its workers' reports), and the
`ClusterRun` that `Cluster.run` returns, whose `check()` raises `ClusterFailed` with the logs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


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
