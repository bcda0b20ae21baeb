"""What each spec says of node 0's /metrics (entrypoint.metrics.collector): the port, a named
container port and scrape annotations where a pod template is node 0's alone, a prometheus-operator
PodMonitor (in a comment: it needs the operator's CRDs) that selects node 0's pod, and how to read
it with `entrypoint status`. The port is the one the nodes derive (entrypoint.plan.ports), or the
ENTRYPOINT_METRICS_PORT given with --env (0: off, nothing is wired)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from entrypoint.plan import ports, values

if TYPE_CHECKING:
    from entrypoint.render.request import Request

PORT_NAME = "metrics"
VARIABLE = "ENTRYPOINT_METRICS_PORT"


def port(request: Request, master_port: int | None) -> int | None:
    """Node 0's metrics port; None when it is off, or unknown here (SLURM derives the
    rendezvous port from the job id)."""
    env = dict(request.env)
    if env.get(VARIABLE) is not None:
        return values.number(f"--env {VARIABLE}", env[VARIABLE], low=0, high=65535) or None
    if master_port is None:
        return None
    control = env.get("ENTRYPOINT_CONTROL_PORT")
    stated = (
        values.number("--env ENTRYPOINT_CONTROL_PORT", control, low=1, high=65535)
        if (control is not None)
        else None
    )
    return ports.metrics_after(master_port, stated or ports.control_after(master_port))


def container_port(metrics_port: int | None) -> list[dict]:
    return [{"name": PORT_NAME, "containerPort": metrics_port}] if metrics_port else []


def pod_annotations(metrics_port: int | None) -> dict:
    """The `prometheus.io/*` annotations that annotation-based scrape configs (the Prometheus
    Helm chart's, many clusters') read: for a template that only node 0's pod uses."""
    if not metrics_port:
        return {}
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(metrics_port),
        "prometheus.io/path": "/metrics",
    }


def kube_lines(
    request: Request,
    metrics_port: int | None,
    pod0: str,
    selector: dict[str, str],
    named: bool = True,
) -> list[str]:
    """Header lines: where node 0 serves its metrics, how to read them, and a PodMonitor."""
    if not metrics_port:
        return [f"Metrics: off ({VARIABLE}=0)."]
    ns = f" -n {request.namespace}" if request.namespace else ""
    endpoint = f"port: {PORT_NAME}" if named else f"targetPort: {metrics_port}"
    labels = [
        f"      {key}: {value!r}" if value.isdigit() else f"      {key}: {value}"
        for key, value in selector.items()
    ]
    return [
        f"Metrics: node 0 ({pod0}) serves every node's health at :{metrics_port}/metrics"
        + (f" (port {PORT_NAME})" if named else "")
        + f". Live table: kubectl{ns} port-forward pod/{pod0} {metrics_port} & "
        f"entrypoint status 127.0.0.1:{metrics_port}",
        "prometheus-operator users: this PodMonitor scrapes node 0 alone:",
        "  apiVersion: monitoring.coreos.com/v1",
        "  kind: PodMonitor",
        f"  metadata: {{name: {request.name}"
        + (f", namespace: {request.namespace}" if request.namespace else "")
        + "}",
        "  spec:",
        "    selector:",
        "      matchLabels:",
        *["  " + line for line in labels],
        f"    podMetricsEndpoints: [{{{endpoint}, interval: 15s}}]",
    ]


def script_lines(metrics_port: int | None, node0: str) -> list[str]:
    """For SLURM and docker: where node 0's metrics are, and how to read them."""
    if metrics_port is None:
        return [
            f"Metrics: node 0 serves every node's health at http://{node0}:<port>/metrics; its "
            "log names the port (the control port + 1). Live table: entrypoint status "
            f"{node0}:<port>; Prometheus: a static target, or {VARIABLE} fixed with --env."
        ]
    return [
        f"Metrics: node 0 serves every node's health at http://{node0}:{metrics_port}/metrics. "
        f"Live table: entrypoint status {node0}:{metrics_port}; Prometheus: a static target."
    ]
