"""Volcano Job (batch.volcano.sh/v1alpha1): task `master` x1 and task `worker` x N-1, gang
scheduled, one pod per node.

Its job plugins put the rest in the pods (volcano-sh/volcano, pkg/controllers/job/plugins;
https://volcano.sh/en/docs/vcjob/): pytorch sets MASTER_ADDR=<job>-master-0.<job>, MASTER_PORT
(its --port, 23456 unless stated), WORLD_SIZE (master + worker pods) and RANK (master 0, worker
i -> i + 1); svc gives each pod the host name <job>-<task>-<i> under a headless Service named
after the job, and VC_<TASK>_HOSTS/VC_<TASK>_NUM; env sets VC_TASK_INDEX. That is what
entrypoint/plan/platforms/volcano.py reads.
"""

from __future__ import annotations

from typing import Any

from entrypoint.render import scrape, text
from entrypoint.render.request import Request

NAME = "volcano"
SUMMARY = "a Volcano Job with the pytorch, svc and env plugins"
DOCS = "https://volcano.sh/en/docs/vcjob/"
OPTIONS = ("--master-port", "--namespace", "--secret-name", "--token")

MASTER = "master"
WORKER = "worker"
PLUGIN_PORT = 23456  # the pytorch plugin's DefaultPort


def master_addr(request: Request) -> str:
    return f"{request.name}-{MASTER}-0.{request.name}"


def metrics_port(request: Request) -> int | None:
    return scrape.port(request, request.master_port or PLUGIN_PORT)


def _task(request: Request, name: str, replicas: int, **more: Any) -> dict:
    node0 = name == MASTER
    ports = scrape.container_port(metrics_port(request)) if node0 else []
    container = text.kube_container(request, "node", ports=ports)
    template: dict = {"spec": text.kube_pod_spec(container)}
    annotations = scrape.pod_annotations(metrics_port(request)) if node0 else {}
    if annotations:
        template = {"metadata": {"annotations": annotations}} | template
    return {
        "name": name,
        "replicas": replicas,
        **more,
        "template": template,
    }


def _tasks(request: Request) -> list[dict]:
    """The master task (node 0) and the workers; with spares a failed worker restarts alone,
    and the master too where a survivor takes node 0's seat (it joins the new node 0)."""
    restart = [{"event": event, "action": "RestartTask"} for event in ("PodFailed", "PodEvicted")]
    done = [{"event": "TaskCompleted", "action": "CompleteJob"}]
    again = restart if text.node0_survives(request) else []
    tasks = [_task(request, MASTER, 1, policies=done + again)]
    if request.machines > 1:
        more = {"policies": restart} if request.elastic else {}
        tasks.append(_task(request, WORKER, request.machines - 1, **more))
    return tasks


def render(request: Request) -> str:
    pytorch = [f"--master={MASTER}", f"--worker={WORKER}"]
    if request.master_port is not None:
        pytorch.append(f"--port={request.master_port}")
    tasks = _tasks(request)
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": text.kube_metadata(request),
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": request.machines,
            "plugins": {"pytorch": pytorch, "svc": [], "env": []},
            "policies": [
                {"event": "PodEvicted", "action": "RestartJob"},
                {"event": "PodFailed", "action": "AbortJob"},
            ],
            "tasks": tasks,
        },
    }
    opening = _opening(request)
    return text.yaml_documents([(job, _notes(request))], opening)


def _opening(request: Request) -> list[str]:
    port = request.master_port or PLUGIN_PORT
    return text.header(
        request,
        (f"{request.name}: {text.shape(request)}, a Volcano Job of {request.image}"),
        [
            *text.kube_notes(request),
            (
                f"Node 0 is the master task's pod, {master_addr(request)}:{port}; worker i is node "
                f"i + 1."
            ),
            *text.when_a_node_dies(
                request,
                "Volcano starts a failed worker's pod again (RestartTask), a standby then;",
                "the master's pod, started again (RestartTask), joins the new node 0 as a standby.",
            ),
            *scrape.kube_lines(
                request,
                metrics_port(request),
                f"{request.name}-{MASTER}-0",
                {"volcano.sh/job-name": request.name, "volcano.sh/task-spec": MASTER},
            ),
        ],
    )


def _notes(request: Request) -> list:
    notes = [
        ("minAvailable:", "Gang scheduling: every node starts, or none does."),
        (
            "plugins:",
            (
                "pytorch: MASTER_ADDR, MASTER_PORT, WORLD_SIZE (pods) and RANK in every pod; "
                "svc: host names under a headless Service; env: VC_TASK_INDEX."
            ),
        ),
        (
            "policies:",
            (
                "A lost node breaks the rendezvous of all: restart the whole job when a pod "
                "is evicted, stop it when one fails."
            ),
        ),
        (f"- name: {MASTER}", "Node 0. When it completes, the job has."),
    ]
    notes.append(("imagePullPolicy:", text.pull_note(request.image)))
    if request.gpus_per_node:
        notes.append(("resources:", text.ENV_NOTES["gpu"]))
    notes.append(("volumes:", text.ENV_NOTES["shm"]))
    return notes
