"""SLURM: an sbatch script with one task per node, started by srun, the entrypoint in each.

srun gives every task SLURM_JOB_ID, the node list, SLURM_NODEID and, with --gres, the node's GPU
count (https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES), which is all
entrypoint/plan/platforms/slurm.py needs: node 0 is the first host, the port comes from the job id.
Three ways to run the image (--runtime):

- pyxis: `srun --container-image` (NVIDIA pyxis and enroot, https://github.com/NVIDIA/pyxis);
- apptainer: `srun apptainer exec --nv docker://IMAGE` (https://apptainer.org/docs/user/latest/gpu.html);
- none: the nodes run the image already (their environment is the image), so srun starts
  `entrypoint run` directly.
"""

from __future__ import annotations

from entrypoint.render import quote, scrape, text
from entrypoint.render.request import Request

NAME = "slurm"
SUMMARY = "an sbatch script, one task per node (--runtime pyxis, apptainer or none)"
DOCS = "https://slurm.schedmd.com/sbatch.html"
OPTIONS = ("--runtime", "--time", "--partition", "--account", "--master-port")

# Seconds before the time limit at which every task gets SIGTERM (--signal).
SIGNAL_AHEAD = 120
SCRIPT_LOG = "%x-%j.out"  # job name, job id
NODE_LOG = "%x-%j-%N.out"  # ... and the node's short host name: one file per node


def pyxis_image(image: str) -> str:
    """pyxis spells a registry with #: ghcr.io/org/img:tag -> ghcr.io#org/img:tag."""
    if image.startswith(("/", ".")) or "#" in image:
        return image  # a squashfs file, or already pyxis's form
    first, slash, rest = image.partition("/")
    registry = slash and ("." in first or ":" in first or first == "localhost")
    return f"{first}#{rest}" if registry else image


def apptainer_image(image: str) -> str:
    """A .sif file as it is; anything else is pulled from a registry."""
    return image if image.endswith(".sif") or image.startswith("/") else f"docker://{image}"


def _directives(request: Request) -> list[str]:
    lines = [
        f"#SBATCH --job-name={request.name}",
        f"#SBATCH --nodes={request.machines}",
        "# One task per node: the entrypoint on each node starts its workers, one per GPU.",
        "#SBATCH --ntasks-per-node=1",
    ]
    if request.gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{request.gpus_per_node}")
    lines += [
        "# Whole nodes: no other job shares their GPUs, memory or network.",
        "#SBATCH --exclusive",
        f"#SBATCH --time={request.time}",
        f"# SIGTERM to every task {SIGNAL_AHEAD} s before the time limit: the entrypoint and",
        "# torchrun pass it to the workers, which can save a checkpoint before the SIGKILL.",
        f"#SBATCH --signal=TERM@{SIGNAL_AHEAD}",
        f"#SBATCH --output={SCRIPT_LOG}",
    ]
    if request.elastic:
        lines += [
            "# A node that fails does not end the allocation: the others go on (spares, shrink).",
            "#SBATCH --no-kill",
        ]
    if request.partition:
        lines.append(f"#SBATCH --partition={request.partition}")
    if request.account:
        lines.append(f"#SBATCH --account={request.account}")
    return lines


def _environment(request: Request) -> list[str]:
    lines = []
    if request.master_port is not None:
        lines.append(f"export MASTER_PORT={request.master_port}")
    for key, value in request.env:
        if value is not None:
            lines.append(f"export {key}={quote.shell_word(value)}")
    if request.secrets:
        lines += [
            (
                f"# {', '.join(request.secrets)}: secret, never written here. Export it in the "
                "shell you run sbatch"
            ),
            ("# from: sbatch passes that environment on (--export=ALL, the default)."),
        ]
    lines += [
        (
            "# The control channel's token: a fresh secret for this job, so that only its "
            "tasks join node 0"
        ),
        ("# (the job id, SLURM_JOB_ID, is checked too). Never written to a file."),
        (
            "ENTRYPOINT_JOB_TOKEN=\"$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')\"; "
            "export ENTRYPOINT_JOB_TOKEN"
        ),
    ]
    lines.insert(0, "# srun passes this environment to every task.")
    return lines


def _launch(request: Request) -> list[str]:
    """The srun line, in the runtime's flavour, one option per line."""
    srun = [
        "srun --ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        '--cpus-per-task="$SLURM_CPUS_ON_NODE"',
        f"--output={NODE_LOG}",
    ]
    notes = [
        "# --kill-on-bad-exit: one node failing stops the others instead of leaving them waiting.",
        "# --cpus-per-task: the task gets every CPU of its node, for its workers and data loaders.",
    ]
    entrypoint = quote.shell_join(["entrypoint", *request.entrypoint_args()])
    if request.runtime == "pyxis":
        srun.append(f"--container-image={quote.shell_word(pyxis_image(request.image))}")
        notes.append(
            "# pyxis imports the image on each node and runs the command in it, "
            "with the job's GPUs."
        )
        if not request.image.startswith(("/", ".")):
            notes += [
                "# enroot keeps the layers it pulled in each node's ENROOT_CACHE_PATH: a new tag",
                "# fetches only its changed layers. For many nodes, import once to a shared file",
                f"# system: `enroot import -o /shared/{request.name}.sqsh "
                f"docker://{pyxis_image(request.image)}`,",
                f"# then render with --image /shared/{request.name}.sqsh: no node pulls.",
            ]
        run = [entrypoint]
    elif request.runtime == "apptainer":
        notes += [
            (
                f"# apptainer --nv binds the node's GPUs; faster: `apptainer pull image.sif "
                f"{apptainer_image(request.image)}`"
            ),
            "# once on a shared file system, then render with --image /path/image.sif.",
        ]
        run = [
            "apptainer exec --nv " + quote.shell_word(apptainer_image(request.image)),
            entrypoint,
        ]
    else:
        notes.append(
            f"# The nodes' own environment is the image {request.image}: entrypoint "
            "is on their PATH."
        )
        run = [entrypoint]
    parts = srun + run
    return notes + [" \\\n    ".join(parts)]


def render(request: Request) -> str:
    title = (
        f"{request.name}: {text.shape(request)} under SLURM, image {request.image} "
        f"(runtime: {request.runtime})"
    )
    opening = text.header(
        request,
        title,
        [
            f"Submit: sbatch FILE. Logs: {SCRIPT_LOG} (this script), {NODE_LOG} (each node).",
            "Each node's entrypoint reads SLURM_* (node list, node id, GPUs): node 0 is the first",
            "host, the port is derived from the job id unless MASTER_PORT is set.",
            *text.when_a_node_dies(
                request,
                "SLURM cannot add a node to a running allocation: the spares are all there is;",
                "SLURM starts no node in its place.",
            ),
            *scrape.script_lines(scrape.port(request, request.master_port), "<first node>"),
        ],
    )
    lines = [
        "#!/bin/bash",
        *("# " + line for line in opening),
        *_directives(request),
        "",
        "set -euo pipefail",
        "",
    ]
    environment = _environment(request)
    if environment:
        lines += [*environment, ""]
    lines += _launch(request)
    return "\n".join(lines) + "\n"
