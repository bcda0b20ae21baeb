"""Kubeflow Trainer v2 TrainJob on the torch-distributed runtime: a JobSet of one Indexed Job,
one pod per node.

The Torch plugin sets, in the `node` container, PET_NNODES (numNodes), PET_NPROC_PER_NODE
(numProcPerNode; "auto" unless given, which on CPU means one per CPU core), PET_NODE_RANK (the
completion index), PET_MASTER_ADDR=<job>-node-0-0.<job> and PET_MASTER_PORT=29500, fixed
(kubeflow/trainer v2.3.0, pkg/runtime/framework/plugins/torch/torch.go, pkg/constants;
https://www.kubeflow.org/docs/components/trainer/). It refuses those names in trainer.env, so the
spec states only the counts. /dev/shm comes through runtimePatches (v2.3; earlier releases named
it podTemplateOverrides).
"""

from __future__ import annotations

from entrypoint.render import scrape, text
from entrypoint.render.request import Request

NAME = "trainjob"
SUMMARY = "a Kubeflow Trainer v2 TrainJob (torch-distributed runtime)"
DOCS = "https://www.kubeflow.org/docs/components/trainer/"
OPTIONS = ("--namespace", "--secret-name", "--token")

RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime the Trainer's manifests install
NODE = "node"  # the runtime's replicated job and container
TRAINER_PORT = 29500  # constants.ContainerTrainerPort
PATCH_MANAGER = "entrypoint.render"


def master_addr(request: Request) -> str:
    return f"{request.name}-{NODE}-0-0.{request.name}"


def render(request: Request) -> str:
    return text.yaml_documents([(_job(request), _notes(request))], _opening(request))


def _trainer(request: Request) -> dict:
    trainer: dict = {
        "image": request.image,
        "args": request.entrypoint_args(),
        "numNodes": request.machines,
        "numProcPerNode": request.nproc_per_node,
    }
    if request.gpus_per_node:
        trainer["resourcesPerNode"] = {"limits": {text.GPU_RESOURCE: request.gpus_per_node}}
    env = text.kube_env(request)
    if env:
        trainer["env"] = env
    return trainer


def _job(request: Request) -> dict:
    node: dict = {
        "name": NODE,
        "volumeMounts": [{"name": text.SHM_VOLUME, "mountPath": text.SHM_PATH}],
    }
    pod = {
        "containers": [node],
        "volumes": [text.shm_volume()],
    }
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": text.kube_metadata(request),
        "spec": {
            "runtimeRef": {"name": RUNTIME},
            "trainer": _trainer(request),
            "runtimePatches": [
                {
                    "manager": PATCH_MANAGER,
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": NODE,
                                        "template": {"spec": {"template": {"spec": pod}}},
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


def _opening(request: Request) -> list[str]:
    return text.header(
        request,
        (f"{request.name}: {text.shape(request)}, a Kubeflow TrainJob of {request.image}"),
        [
            *text.kube_notes(request),
            f"Node 0 is pod {master_addr(request)}:{TRAINER_PORT} (the Trainer fixes the port).",
            f"Needs Kubeflow Trainer v2.3 or later with the {RUNTIME} ClusterTrainingRuntime.",
            *text.when_a_node_dies(
                request,
                "the runtime's JobSet decides pod restarts (its failurePolicy restarts the whole "
                "job, which resumes from its checkpoint);",
                "the JobSet may still restart the whole job.",
            ),
            *scrape.kube_lines(
                request,
                scrape.port(request, TRAINER_PORT),
                f"{request.name}-{NODE}-0-0",
                {
                    "jobset.sigs.k8s.io/jobset-name": request.name,
                    "batch.kubernetes.io/job-completion-index": "0",
                },
                named=False,  # the runtime patch takes no container ports
            ),
        ],
    )


def _notes(request: Request) -> list:
    notes = [
        (
            "runtimeRef:",
            (
                f"The {RUNTIME} runtime sets PET_NNODES, PET_NODE_RANK and "
                "PET_MASTER_ADDR in every pod; the entrypoint reads them."
            ),
        ),
        ("args:", "Kept the image's entrypoint (tini, then entrypoint): only its arguments."),
        (
            "numProcPerNode:",
            (
                "Workers per node: one per GPU, one on CPU (the runtime's auto "
                "would start one per CPU core)."
            ),
        ),
    ]
    if request.gpus_per_node:
        notes.append(("resourcesPerNode:", text.ENV_NOTES["gpu"]))
    notes.append(("runtimePatches:", text.ENV_NOTES["shm"]))
    return notes
