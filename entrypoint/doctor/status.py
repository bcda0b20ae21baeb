"""`entrypoint status`: every node of a running job, from node 0's `/metrics`
(entrypoint.metrics.collector).

Works from any machine that reaches node 0's metrics port: a login node, a laptop through a
port-forward, or a pod of the job (`kubectl exec job-0 -- entrypoint status`). Any node's host
will do: the other nodes' metrics ports point at node 0's (307), wherever node 0 is now, after
a takeover too. In a terminal the
table is redrawn in place every `--interval` seconds until Ctrl-C; piped, or with `--json` or
`--once`, it is printed once. Exit status: 0 healthy (every node up, training at full size, none
slow), 1 degraded (a node lost or slow, or fewer nodes than the full size), 2 unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.ports import DEFAULT_MASTER_PORT

HEALTHY, DEGRADED, UNREACHABLE = 0, 1, 2
TIMEOUT = 5.0
LABEL_LIMIT = 64  # characters of a label value shown


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = sub.add_parser(
        "status",
        help="show every node of a running job (node 0's /metrics)",
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
    )
    status.add_argument(
        "address",
        nargs="?",
        metavar="HOST[:PORT]",
        help="node 0 and its metrics port (default: MASTER_ADDR and ENTRYPOINT_METRICS_PORT, "
        "else MASTER_PORT + 2, as the job's nodes derive it)",
    )
    status.add_argument("--json", action="store_true", help="print one JSON object and exit")
    status.add_argument("--once", action="store_true", help="print the table once and exit")
    status.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between redraws"
    )


def target(address: str | None, env: Mapping[str, str]) -> str:
    """The URL of node 0's /metrics, from the argument or the job's own variables."""
    from entrypoint.plan import values  # not at import: the CLI builds its parser from this module

    if address:
        if address.startswith(("http://", "https://")):
            return address if address.rstrip("/").endswith("/metrics") else address + "/metrics"
        host, port = _split(address)
    else:
        raw = env.get("ENTRYPOINT_MASTER_ADDR") or env.get("MASTER_ADDR") or "127.0.0.1"
        host = values.host("MASTER_ADDR", raw)
        port = None
    if port is None:
        port = _default_port(env)
    return f"http://{values.host_port(host, port)}/metrics"


def _split(address: str) -> tuple[str, int | None]:
    from entrypoint.plan import values

    if address.startswith("[") and "]:" in address:
        host, _, port = address[1:].partition("]:")
    elif address.count(":") == 1:
        host, _, port = address.partition(":")
    else:
        return values.host("HOST", address), None
    return values.host("HOST", host), values.number("PORT", port, low=1, high=65535)


def _default_port(env: Mapping[str, str]) -> int:
    """As the job's nodes derive it (entrypoint.plan.ports) from the variables they were given."""
    from entrypoint.plan import ports, values

    def read(name: str) -> int | None:
        raw = env.get(name)
        return values.number(name, raw, low=1, high=65535) if raw else None

    stated = read("ENTRYPOINT_METRICS_PORT")
    if stated:
        return stated
    master = read("MASTER_PORT") or DEFAULT_MASTER_PORT
    control = read("ENTRYPOINT_CONTROL_PORT") or ports.control_after(master)
    return ports.metrics_after(master, control)


def fetch(url: str) -> str:
    import urllib.request  # here: its import costs every other command 40 ms

    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:  # noqa: S310 - http only
        return response.read(16 << 20).decode()


def read(text: str) -> dict:
    """The job and its nodes from the metrics' text."""
    from prometheus_client.parser import text_string_to_metric_families

    nodes: dict[str, dict] = {}
    ranks: dict[tuple[str, str], dict] = {}
    job: dict = {"phase": None, "nodes": {}}
    from entrypoint.control.message_fields import shown

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("multinode_")
            # What node 0 serves is what the nodes said of themselves: escaped, cut.
            labels = {k: shown(str(v), LABEL_LIMIT) for k, v in sample.labels.items()}
            value = sample.value
            if "rank" in labels and name.startswith("rank_"):
                rank = ranks.setdefault((labels["node"], labels["rank"]), {})
                rank["node"], rank["host"], rank["rank"] = (
                    int(labels["node"]),
                    labels["host"],
                    int(labels["rank"]),
                )
                rank[name.removeprefix("rank_")] = value
            elif "node" in labels:
                node = nodes.setdefault(labels["node"], {"gpus": 0})
                node["node"], node["host"] = int(labels["node"]), labels["host"]
                if name == "node_state":
                    if value == 1:
                        node["state"] = labels["state"]
                else:
                    node[name.removeprefix("node_")] = value
            elif name == "job_phase":
                if value == 1:
                    job["phase"] = labels["phase"]
            elif name == "job_nodes":
                job["nodes"][labels["state"]] = int(value)
            elif name == "job_info":
                job["name"], job["platform"] = labels["job"], labels["platform"]
            elif name.startswith("job_"):
                job[name.removeprefix("job_")] = value
    rows = sorted(nodes.values(), key=lambda n: n["node"])
    job["members"] = rows
    job["ranks"] = sorted(ranks.values(), key=lambda r: (r["rank"], r["node"]))
    return job


def health(job: dict) -> tuple[int, list[str]]:
    """HEALTHY or DEGRADED, and why."""
    why = []
    lost = [n for n in job["members"] if n.get("state") == "lost"]
    slow = [n for n in job["members"] if n.get("slow")]
    if lost:
        why.append("lost: " + ", ".join(f"node {n['node']} ({n['host']})" for n in lost))
    if slow:
        why.append("slow: " + ", ".join(f"node {n['node']} ({n['host']})" for n in slow))
    slow_ranks = [r for r in job.get("ranks", []) if r.get("slow")]
    if slow_ranks:
        why.append(
            "slow: "
            + ", ".join(f"rank {r['rank']} on node {r['node']} ({r['host']})" for r in slow_ranks)
        )
    training = job["nodes"].get("training", 0)
    full = int(job.get("nodes_full", 0))
    if job["phase"] == "run" and training < full:
        why.append(f"training on {training} of {full} nodes")
    if job["phase"] == "end":
        why.append("the job has ended")
    return (DEGRADED if why else HEALTHY), why


def table(job: dict, url: str) -> str:
    code, why = health(job)
    head = (
        f"job {job.get('name', '?')} on {job.get('platform', '?')}: {job['phase']}, "
        f"{job['nodes'].get('training', 0)} of {int(job.get('nodes_full', 0))} nodes training, "
        f"{int(job.get('spares_left', 0))} standby, {int(job.get('restarts', 0))} restarts, "
        f"world size {int(job.get('world_size', 0))}, training for "
        f"{job.get('training_seconds', 0):.0f} s   ({url})"
    )
    lines = [head, "health: " + ("; ".join(why) if why else "healthy")]
    lines.append(
        f"{'node':>4}  {'rank':>4}  {'host':<24} {'state':<9} {'last beat':>9}  {'GPU util':>8}  "
        f"{'GPU memory':>16}  slow"
    )
    for n in job["members"]:
        rank = int(n.get("rank", -1))
        beat = n.get("last_heartbeat_seconds")
        if n["gpus"]:
            util = f"{n['gpu_utilization_percent']:.0f}%"
            mem = (
                f"{n['gpu_memory_used_bytes'] / 2**30:.1f}/"
                f"{n['gpu_memory_total_bytes'] / 2**30:.0f} GiB"
            )
        else:
            util, mem = "-", f"CPU load {n['cpu_load']:.1f}" if "cpu_load" in n else "-"
        lines.append(
            f"{n['node']:>4}  {rank if rank >= 0 else '-':>4}  {n['host'][:24]:<24} "
            f"{n.get('state', '?'):<9} {'-' if beat is None else f'{beat:.0f} s ago':>9}  "
            f"{util:>8}  {mem:>16}  {'yes' if n.get('slow') else ''}"
        )
    lines += rank_table(job)
    return "\n".join(lines)


def rank_table(job: dict) -> list[str]:
    """The ranks' progress: steps, step time, time before backward, last step, slow."""
    ranks = job.get("ranks") or []
    if not ranks:
        return []
    goodput = job.get("goodput_ratio")
    lines = [
        f"progress: {int(job.get('steps', 0))} steps, {job.get('steps_per_second', 0):.2f} "
        f"steps/s, goodput {'-' if goodput is None else f'{goodput:.1%}'}, hang timeout "
        f"{job.get('hang_timeout_seconds', 0):.0f} s",
        f"{'rank':>4}  {'node':>4}  {'host':<24} {'steps':>8}  {'step':>8}  "
        f"{'before bw':>9}  {'last step':>9}  slow",
    ]
    for r in ranks[:256]:
        step, lead, last = (
            r.get(k) for k in ("step_seconds", "before_backward_seconds", "last_step_seconds")
        )
        row = (
            f"{r['rank']:>4}  {r['node']:>4}  {r['host'][:24]:<24} {int(r.get('steps', 0)):>8}  "
            f"{'-' if step is None else f'{step:.3f} s':>8}  "
            f"{'-' if lead is None else f'{lead:.3f} s':>9}  "
            f"{'-' if last is None else f'{last:.0f} s ago':>9}  {'yes' if r.get('slow') else ''}"
        )
        lines.append(row.rstrip())
    if len(ranks) > 256:
        lines.append(f"... {len(ranks) - 256} more ranks (--json has them all)")
    return lines


def cmd_status(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    if not args.interval > 0:
        raise ConfigError("--interval", args.interval, "must be above 0", "Give --interval 2")
    url = target(args.address, env)
    # On a node of the job, its own metrics port is node 0's or points at it: where MASTER_ADDR
    # names a node 0 that was lost, this node still knows the new one.
    here = None if args.address else target("127.0.0.1", env)
    live = not (args.json or args.once) and sys.stdout.isatty()
    while True:
        try:
            try:
                job = read(fetch(url))
            except OSError:
                if here is None or here == url:
                    raise
                job = read(fetch(here))
                url = here
        except (OSError, ValueError) as err:  # urllib's URLError is an OSError
            reason = getattr(err, "reason", None) or err
            print(
                f"entrypoint: status: node 0's metrics at {url} cannot be read ({reason}). "
                "Check that the job runs, that this machine reaches node 0 on that port, and "
                "that ENTRYPOINT_METRICS_PORT is not 0. If node 0 was lost and another node "
                "took its place, give any node's host: every node's metrics port points at "
                "node 0 (entrypoint status HOST)",
                file=sys.stderr,
            )
            return UNREACHABLE
        code, why = health(job)
        if args.json:
            print(json.dumps(job | {"health": "degraded" if code else "healthy", "why": why}))
            return code
        text = table(job, url)
        if not live:
            print(text)
            return code
        sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
        sys.stdout.flush()
        time.sleep(args.interval)
