"""Machines started by hand: one `docker run` per machine, no scheduler.

Nothing assigns ranks, so each command states NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT,
the torchrun-style names entrypoint/plan/platforms/torchrun.py reads (per-worker scripts export
the same by hand; https://pytorch.org/docs/stable/elastic/run.html), and GPUS_PER_NODE, which
`entrypoint run` checks against the machine before it starts anything. Docker's side:
https://docs.docker.com/reference/cli/docker/container/run/ (--gpus needs the NVIDIA Container
Toolkit; --network host and --ipc host give NCCL the host's interfaces and shared memory).
"""

from __future__ import annotations

from entrypoint.plan.ports import DEFAULT_MASTER_PORT
from entrypoint.render import quote, scrape, text
from entrypoint.render.request import Request

NAME = "docker"
SUMMARY = "one docker run command per machine started by hand"
DOCS = "https://docs.docker.com/reference/cli/docker/container/run/"
OPTIONS = ("--master-addr", "--master-port")

# RDMA registers (pins) memory, and the default 8 MiB stack is small for some NCCL paths.
ULIMITS = ("--ulimit memlock=-1", "--ulimit stack=67108864")


def _command(request: Request, rank: int) -> list[str]:
    port = request.master_port or DEFAULT_MASTER_PORT
    master = request.master_addr or "127.0.0.1"
    # With spares, docker starts a failed node's container again: it rejoins as a standby;
    # node 0's too where a survivor takes its seat (it joins the new node 0 then).
    again = (
        "--restart on-failure"
        if request.elastic and (rank or text.node0_survives(request))
        else "--rm"
    )
    lines = [f"docker run {again} --name {request.name}-node{rank}"]
    lines.append(
        " ".join(["--gpus all"] * bool(request.gpus_per_node) + ["--network host", "--ipc host"])
    )
    lines.append(" ".join(ULIMITS))
    env = [
        f"NNODES={request.machines}",
        f"NODE_RANK={rank}",
        f"MASTER_ADDR={master}",
        f"MASTER_PORT={port}",
        f"{text.JOB_ID}={request.name}",
        text.JOB_TOKEN,
    ]
    if request.gpus_per_node:
        env.append(f"GPUS_PER_NODE={request.gpus_per_node}")
    lines.append(" ".join(f"-e {quote.shell_word(item)}" for item in env))
    extra = [
        f"-e {quote.shell_word(key if value is None else f'{key}={value}')}"
        for key, value in request.env
    ]
    if extra:
        lines.append(" ".join(extra))
    lines.append(quote.shell_join([request.image, *request.entrypoint_args()]))
    return [" \\\n    ".join(lines)]


def render(request: Request) -> str:
    port = request.master_port or DEFAULT_MASTER_PORT
    opening = text.header(
        request,
        (f"{request.name}: {text.shape(request, 'machine')} started by hand, {request.image}"),
        [
            "Run block i on machine i, in any order; node 0 waits for the others.",
            *(
                [
                    (
                        f"Machine 0 is {request.master_addr}: the others reach it on TCP ports "
                        f"{port} (rendezvous) and {port + 1}"
                    ),
                    "(the entrypoints' own channel), so let them through its firewall.",
                ]
                if request.machines > 1
                else []
            ),
            "--network host and --ipc host: NCCL uses the machine's interfaces and shared memory",
            "(without --ipc host, give --shm-size=16g). With InfiniBand, add to each command:",
            "  --device /dev/infiniband",
            "the entrypoint then finds the HCAs in /sys/class/infiniband and sets NCCL_IB_HCA.",
            (
                "Control token (only this job's machines can join node 0): export the same value "
                "on every machine first,"
            ),
            f"  export {text.JOB_TOKEN}=<the output of `{text.TOKEN_COMMAND}`, run once>",
            *text.when_a_node_dies(
                request,
                "docker starts a failed node's container again, a standby then;",
                "node 0's container, started again, joins the new node 0 as a standby.",
            ),
            *scrape.script_lines(scrape.port(request, port), request.master_addr or "127.0.0.1"),
            *(
                [
                    (
                        f"{', '.join(request.secrets)}: secret, never written here: docker takes "
                        "it from the shell (export it there first)."
                    )
                ]
                if request.secrets
                else []
            ),
        ],
    )
    blocks = []
    for rank in range(request.machines):
        role = (
            "node 0, the master"
            if rank == 0
            else f"node {rank}, a spare"
            if rank >= request.nodes
            else f"node {rank}"
        )
        blocks.append("\n".join([f"# Machine {rank} ({role})", *_command(request, rank)]))
    return text.comment(opening) + "\n" + "\n\n".join(blocks) + "\n"
