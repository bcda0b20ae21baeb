"""Kubeflow training-operator v1 PyTorchJob: Master x1 and Worker x N-1, one pod per node.

The operator names the pods <job>-master-0 and <job>-worker-<i> and gives every container
MASTER_ADDR=<job>-master-0, MASTER_PORT (the container port named pytorchjob-port,
23456 unless stated), RANK (the pod's index) and, from v1.7, PET_NNODES, PET_NODE_RANK and
PET_NPROC_PER_NODE=nprocPerNode, with WORLD_SIZE = pods x nprocPerNode
(kubeflow/training-operator v1.9.0, pkg/controller.v1/pytorch/envvar.go and master.go;
https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/). So the spec
states nothing but the replicas, nprocPerNode and, when asked, the port.
"""

from __future__ import annotations

from entrypoint.render import scrape, text
from entrypoint.render.request import Request

NAME = "pytorchjob"
SUMMARY = "a Kubeflow training-operator v1 PyTorchJob (Master + Workers)"
DOCS = "https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/"
OPTIONS = ("--master-port", "--namespace", "--secret-name", "--token")

CONTAINER = "pytorch"  # the operator refuses a job without a container of this name
PORT_NAME = "pytorchjob-port"
PYTORCHJOB_PORT = 23456  # PyTorchJobDefaultPort, pkg/apis/kubeflow.org/v1/pytorch_types.go


def master_addr(request: Request) -> str:
    return f"{request.name}-master-0"


RESTARTS = 10  # with spares: pod restarts in all before the job fails


def metrics_port(request: Request) -> int | None:
    return scrape.port(request, request.master_port or PYTORCHJOB_PORT)


def _replica(request: Request, replicas: int, node0: bool) -> dict:
    ports = (
        [{"name": PORT_NAME, "containerPort": request.master_port}]
        if request.master_port is not None
        else []
    )
    if node0:
        ports += scrape.container_port(metrics_port(request))
    container = text.kube_container(request, CONTAINER, ports=ports)
    template: dict = {"spec": text.kube_pod_spec(container, restart=None)}
    annotations = scrape.pod_annotations(metrics_port(request)) if node0 else {}
    if annotations:
        template = {"metadata": {"annotations": annotations}} | template
    # The operator copies the replica's restartPolicy into the pod.
    return {
        "replicas": replicas,
        # With spares: a failed pod's container starts again and rejoins as a standby.
        "restartPolicy": "OnFailure" if request.elastic else "Never",
        "template": template,
    }


def render(request: Request) -> str:
    replicas = {"Master": _replica(request, 1, node0=True)}
    if request.machines > 1:
        replicas["Worker"] = _replica(request, request.machines - 1, node0=False)
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": text.kube_metadata(request),
        "spec": {
            "nprocPerNode": str(request.nproc_per_node),
            "runPolicy": {"backoffLimit": RESTARTS if request.elastic else 0},
            "pytorchReplicaSpecs": replicas,
        },
    }
    return text.yaml_documents([(job, _notes(request))], _opening(request))


def _opening(request: Request) -> list[str]:
    port = request.master_port or PYTORCHJOB_PORT
    return text.header(
        request,
        (f"{request.name}: {text.shape(request)}, a Kubeflow PyTorchJob of {request.image}"),
        [
            *text.kube_notes(request),
            f"Node 0 is the Master pod, {master_addr(request)}:{port}; Worker i is node i + 1.",
            "Needs training-operator v1.7 or later (PET_NNODES); the last v1 release is v1.9.",
            *text.when_a_node_dies(
                request,
                f"the operator restarts the failed pod (OnFailure, {RESTARTS} times in all), "
                "which rejoins as a standby;",
                "the Master pod, restarted, joins the new node 0 as a standby.",
            ),
            *scrape.kube_lines(
                request,
                metrics_port(request),
                master_addr(request),
                {
                    "training.kubeflow.org/job-name": request.name,
                    "training.kubeflow.org/replica-type": "master",
                },
            ),
        ],
    )


def _notes(request: Request) -> list:
    notes = [
        (
            "nprocPerNode:",
            (
                "Workers per node: one per GPU (one on CPU). The operator passes it as "
                "PET_NPROC_PER_NODE and counts WORLD_SIZE in processes."
            ),
        ),
        (
            "backoffLimit:",
            ("A lost node breaks the rendezvous of all: fail the job rather than restart one pod."),
        ),
        ("Master:", "Node 0: the operator points every pod's MASTER_ADDR here."),
        (
            f"- name: {CONTAINER}",
            ("The operator wants a container of this name, and takes the port from it."),
        ),
    ]
    if request.master_port is not None:
        notes.append(("ports:", f"The operator takes MASTER_PORT from the port named {PORT_NAME}."))
    notes.append(("imagePullPolicy:", text.pull_note(request.image)))
    if request.gpus_per_node:
        notes.append(("resources:", text.ENV_NOTES["gpu"]))
    notes.append(("volumes:", text.ENV_NOTES["shm"]))
    return notes
