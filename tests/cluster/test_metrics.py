"""A real Prometheus server (Debian's `prometheus`) scrapes node 0 of a 2-node job of node
containers (issue 25): while the job trains it has every node's series; node 1 killed, the job
goes on alone (ENTRYPOINT_MIN_NODES=1) and Prometheus sees node 1 down; `entrypoint status`,
run in node 0's container, shows the same and exits 1."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from faulty_cluster import Fault

from .test_spares import RESUMED, TIMEOUT, TRAINING, at_step, cluster, nodes

PROMETHEUS = shutil.which("prometheus")
METRICS_PORT = 29502  # MASTER_PORT 29500 + 2, as the nodes derive it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus server scraping one target every second, and its HTTP query API."""

    def __init__(self, target: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="prom"))
        self.port = free_port()
        config = self.dir / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: multinode\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.dir / "log").open("w"),
        )

    def query(self, expr: str, label: str = "node") -> dict[str, float]:
        """{label's value: value} of an instant query; {} while Prometheus is not up yet."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                data = json.load(response)
        except OSError:
            return {}
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in data["data"]["result"]}

    def wait_for_ranks(self, expr: str, ranks: int, timeout: float = 30) -> dict[str, float]:
        """{rank: value} once every rank has a value above 0."""
        end = time.monotonic() + timeout
        got: dict[str, float] = {}
        while time.monotonic() < end:
            got = self.query(expr, "rank")
            if len(got) == ranks and all(v > 0 for v in got.values()):
                return got
            time.sleep(0.5)
        return got

    def wait_for(self, expr: str, want: dict[str, float], timeout: float = 30) -> dict:
        end = time.monotonic() + timeout
        got: dict[str, float] = {}
        while time.monotonic() < end:
            got = self.query(expr)
            if got == want:
                return got
            time.sleep(0.5)
        return got

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def test_prometheus_scrapes_node_0_and_sees_a_killed_node_down(image, docker_client, unavailable):
    if PROMETHEUS is None:
        unavailable("needs prometheus (apt-get install prometheus)")
    seen: dict[str, object] = {}
    server: list[Prometheus] = []

    def start_prometheus(c) -> None:
        n0 = c.hostname("node", 0)
        networks = docker_client.containers.get(n0).attrs["NetworkSettings"]["Networks"]
        address = next(iter(networks.values()))["IPAddress"]
        server.append(Prometheus(f"{address}:{METRICS_PORT}"))

    def while_training(c) -> None:
        p = server[0]
        seen["up"] = p.wait_for("multinode_node_up", {"0": 1.0, "1": 1.0})
        seen["state"] = p.wait_for('multinode_node_state{state="training"}', {"0": 1.0, "1": 1.0})
        seen["load"] = sorted(p.query("multinode_node_cpu_load"))
        seen["world"] = p.query("multinode_job_world_size")
        seen["rank_steps"] = p.wait_for_ranks("multinode_rank_steps", 4)
        seen["rank_step_seconds"] = p.wait_for_ranks("multinode_rank_step_seconds", 4)
        seen["goodput"] = p.query("multinode_job_goodput_ratio")
        c.kill(c.hostname("node", 1))

    def after_the_loss(c) -> None:
        p = server[0]
        seen["down"] = p.wait_for("multinode_node_up", {"0": 1.0, "1": 0.0})
        seen["lost"] = p.query('multinode_job_nodes{state="lost"}')
        seen["status"] = c.exec(c.hostname("node", 0), ["entrypoint", "status", "--once"])

    try:
        with cluster(image, docker_client) as c:
            n = [c.hostname("node", r) for r in range(2)]
            run = c.run(
                nodes(c, 2, steps=200, ENTRYPOINT_MIN_NODES="1"),
                timeout=TIMEOUT,
                grace=float("inf"),
                faults=[
                    Fault("prometheus", start_prometheus, node=n[0], line="metrics of every node"),
                    at_step(c, "training", while_training, line=TRAINING),
                    at_step(c, "lost", after_the_loss, line=RESUMED),
                ],
            )
            assert not run.fault_errors, run.fault_errors
            assert run.exit_codes == {n[0]: 0, n[1]: 137}, run.log(80)
    finally:
        for p in server:
            p.close()
    assert seen["up"] == {"0": 1.0, "1": 1.0}, seen
    assert seen["state"] == {"0": 1.0, "1": 1.0}, seen
    assert seen["load"] == ["0", "1"] and seen["world"] == {"": 4.0}, seen
    assert sorted(seen["rank_steps"]) == ["0", "1", "2", "3"], seen  # every rank's steps
    assert sorted(seen["rank_step_seconds"]) == ["0", "1", "2", "3"], seen
    assert 0 < seen["goodput"][""] <= 1, seen
    assert seen["down"] == {"0": 1.0, "1": 0.0}, seen
    assert seen["lost"] == {"": 1.0}, seen
    code, text = seen["status"]
    assert code == 1 and f"lost: node 1 ({n[1]})" in text, text
