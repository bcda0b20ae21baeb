"""Kubernetes: an Indexed Job (one pod per node) and a headless Service naming its pods.

The Job controller gives each pod JOB_COMPLETION_INDEX and the host name <job>-<index>; with
spec.template.spec.subdomain naming a headless Service that selects the pods, node 0 resolves as
<job>-0.<service> (https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode,
https://kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication/). The pod count and the
master are not in the pod's environment, so the template states them as ENTRYPOINT_NNODES and
MASTER_ADDR, the variables entrypoint/plan/platforms/indexedjob.py reads.
"""

from __future__ import annotations

from entrypoint.plan.ports import DEFAULT_MASTER_PORT
from entrypoint.render import scrape, text
from entrypoint.render.request import Request

NAME = "kubernetes"
SUMMARY = "an Indexed Job plus a headless Service (plain Kubernetes)"
DOCS = "https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode"
OPTIONS = ("--master-port", "--namespace", "--secret-name", "--token")

NNODES = "ENTRYPOINT_NNODES"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
# The label the Job controller puts on its pods (every version; batch.kubernetes.io/job-name too
# from 1.27).
JOB_NAME_LABEL = "job-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # on the Job's pods from 1.28


def metrics_port(request: Request) -> int | None:
    return scrape.port(request, request.master_port or DEFAULT_MASTER_PORT)


def master_addr(request: Request) -> str:
    return f"{request.name}-0.{request.name}"


def render(request: Request) -> str:
    return text.yaml_documents(
        [(_service(request), SERVICE_NOTES), (_job(request), _job_notes(request))],
        _opening(request),
    )


def _service(request: Request) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": text.kube_metadata(request),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_NAME_LABEL: request.name},
        },
    }


def _job(request: Request) -> dict:
    fixed = [(NNODES, str(request.machines)), (MASTER_ADDR, master_addr(request))]
    if request.master_port is not None:
        fixed.append((MASTER_PORT, str(request.master_port)))
    container = text.kube_container(
        request, "node", fixed, ports=scrape.container_port(metrics_port(request))
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": text.kube_metadata(request),
        "spec": {
            "completionMode": "Indexed",
            "completions": request.machines,
            "parallelism": request.machines,
            # Kubernetes 1.29+: a failed pod is replaced for its index alone (beta in
            # 1.29-1.32, on by default; GA in 1.33/1.34).
            **(
                {"backoffLimitPerIndex": RESTARTS_PER_INDEX, "podReplacementPolicy": "Failed"}
                if request.elastic
                else {"backoffLimit": 0}
            ),
            "template": {"spec": text.kube_pod_spec(container, subdomain=request.name)},
        },
    }


RESTARTS_PER_INDEX = 3


def _opening(request: Request) -> list[str]:
    port = request.master_port or "29500, torchrun's default"
    return text.header(
        request,
        (f"{request.name}: {text.shape(request)}, a Kubernetes Indexed Job of {request.image}"),
        [
            *text.kube_notes(request),
            f"Pod <index> is node <index>; node 0 is reached as {master_addr(request)}:{port}.",
            (
                f"Logs: kubectl logs{' -n ' + request.namespace if request.namespace else ''} "
                f"-f job/{request.name} (node 0)."
            ),
            *text.when_a_node_dies(
                request,
                f"the Job starts a new pod for the lost index (up to {RESTARTS_PER_INDEX} times "
                "each; Kubernetes 1.29 or newer), which rejoins as a standby;",
                "the new pod 0 joins the new node 0 as a standby.",
            ),
            *scrape.kube_lines(
                request,
                metrics_port(request),
                f"{request.name}-0",
                {JOB_NAME_LABEL: request.name, INDEX_LABEL: "0"},
            ),
            *(
                [
                    "No prometheus.io annotations: every pod shares the template, and only pod 0 "
                    "serves metrics (the PodMonitor selects it by its index label, Kubernetes "
                    "1.28+)."
                ]
                if metrics_port(request)
                else []
            ),
        ],
    )


SERVICE_NOTES = [
    ("clusterIP:", "Headless: a DNS name for each pod, <pod host>.<service>, no load-balancing."),
    (
        "publishNotReadyAddresses:",
        "The names exist before the pods are ready: the rendezvous happens while they start.",
    ),
]


def _job_notes(request: Request) -> list:
    return [
        (
            "completionMode:",
            "Indexed: pod i gets JOB_COMPLETION_INDEX=i, the entrypoint's node rank, and the "
            "host name <job>-<i>.",
        ),
        (
            ("backoffLimitPerIndex:", "A lost pod is started again for its index alone.")
            if request.elastic
            else (
                "backoffLimit:",
                "A lost node breaks the rendezvous of all: fail the job rather than restart one "
                "pod.",
            )
        ),
        (
            "subdomain:",
            f"The headless Service above: gives pod 0 the name {master_addr(request)}.",
        ),
        ("imagePullPolicy:", text.pull_note(request.image)),
        (
            f"- name: {NNODES}",
            "What the pods cannot know by themselves: how many they are, and where node 0 is.",
        ),
        *([("resources:", text.ENV_NOTES["gpu"])] if request.gpus_per_node else []),
        ("volumes:", text.ENV_NOTES["shm"]),
    ]
