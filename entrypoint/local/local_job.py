"""`entrypoint local`: a multi-node job on this one machine, to try it before submitting it.

N containers of the image on a private Docker network, started as hand-started nodes are (NNODES,
NODE_RANK, MASTER_ADDR, MASTER_PORT), each with its own share of this machine's GPUs (node i gets
GPUs i*G..i*G+G-1, by Docker device request) or W CPU workers. Logs stream as they come, prefixed by
node; everything is removed on finish, failure or Ctrl-C (entrypoint.local.cluster).

What the nodes get is decided by pure functions of plain values (`layout`, `nodes`), so a test
checks it without Docker; the GPU probe, the Docker engine and the containers are the edges.
"""

from __future__ import annotations

import argparse
import functools
import os
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from entrypoint.plan.errors import EXIT_CONFIG, ConfigError

# The CLI imports this module at every start: entrypoint.local.cluster only when run.
if TYPE_CHECKING:
    from docker import DockerClient

    from entrypoint.local.cluster import Node

MASTER_PORT = "29500"  # a private network per run: the usual port never collides
CPU_WORKERS = 2  # CPU nodes: more than the entrypoint's default of 1, so each node is multi-worker
# One machine's share: node containers, and per node the entrypoint's own limits (values.py)
DEMO_STEPS = 600  # the built-in job with spares: about a minute here, time to kill a node
MAX_NODES = 64
MAX_WORKERS = 1024
MAX_GPUS = 256


@dataclass(frozen=True)
class ClusterLayout:
    """How many nodes, and what each gets: GPUs (host indices, per node) or CPU workers."""

    nnodes: int
    gpus_per_node: int
    workers: int | None  # None: the entrypoint's default (one per GPU; one process for JAX)
    job: str
    gpu_ids: tuple[tuple[str, ...], ...]  # per node, this machine's GPU indices
    why: str  # one line: how the GPU count was decided
    spares: int = 0  # of the nnodes containers, the last `spares` stand by (ENTRYPOINT_SPARES)
    min_nodes: int | None = None  # ENTRYPOINT_MIN_NODES

    @property
    def training(self) -> int:
        """The nodes that train at the start."""
        return self.nnodes - self.spares

    @property
    def device(self) -> str:
        return "cuda" if self.gpus_per_node else "cpu"


def layout(
    *,
    nnodes: int,
    gpus_per_node: int | None,
    workers: int | None,
    job: str,
    host_gpus: int,
    gpu_probe: str,
    spares: int = 0,
    min_nodes: int | None = None,
) -> ClusterLayout:
    """Check the request against this machine and split its GPUs; raises ConfigError.
    `nnodes` nodes train, `spares` more stand by: every container gets its share."""
    _within("--nodes", nnodes, 1, MAX_NODES, "Pass --nodes 2 for two node containers")
    _within("--spares", spares, 0, MAX_NODES - nnodes, f"Use at most {MAX_NODES} containers")
    if min_nodes is not None:
        _within("--min-nodes", min_nodes, 1, nnodes, f"Pass 1 to {nnodes}, or leave it out")
    training, nnodes = nnodes, nnodes + spares
    if gpus_per_node is not None:
        _within(
            "--gpus-per-node", gpus_per_node, 0, MAX_GPUS, "Pass --gpus-per-node 0 for CPU workers"
        )
    if workers is not None:
        _within("--workers", workers, 1, MAX_WORKERS, "Pass --workers 2, or leave it out")
    if job == "jax" and workers is not None:
        raise ConfigError(
            "--workers",
            workers,
            "the JAX job runs one process per node, owning its devices",
            "Leave --workers out with --job jax",
        )
    if gpus_per_node is None:  # default: an even share of this machine's GPUs, else CPU
        gpus_per_node = host_gpus // nnodes
        why = (
            f"{host_gpus} GPUs here ({gpu_probe}), {gpus_per_node} per node"
            if host_gpus
            else f"no GPU here ({gpu_probe}): CPU workers"
        )
    else:
        why = f"--gpus-per-node {gpus_per_node}; {host_gpus} GPUs here ({gpu_probe})"
    if nnodes * gpus_per_node > host_gpus:
        raise ConfigError(
            "--gpus-per-node",
            gpus_per_node,
            f"{nnodes} nodes x {gpus_per_node} GPUs need {nnodes * gpus_per_node} "
            f"but this machine has {host_gpus} ({gpu_probe})",
            "Use fewer nodes or GPUs per node, or --gpus-per-node 0 for CPU workers",
        )
    if workers is None and gpus_per_node == 0 and job != "jax":
        workers = CPU_WORKERS
    gpu_ids = tuple(
        tuple(str(i) for i in range(n * gpus_per_node, (n + 1) * gpus_per_node))
        for n in range(nnodes)
    )
    return ClusterLayout(
        nnodes, gpus_per_node, workers, job, gpu_ids, why, nnodes - training, min_nodes
    )


def _within(option: str, value: int, low: int, high: int, fix: str) -> None:
    """A number of the command line inside its range (one machine's share), or the one line."""
    if value < low:
        raise ConfigError(option, value, f"must be {low} or more", fix)
    if value > high:
        raise ConfigError(
            option, value, f"is above {high}, this command's limit on one machine", fix
        )


def _option(option: str, raw: str | None, low: int, high: int, what: str) -> int | None:
    """A number option, refused in one line (argparse's int() reads `²`, prints its usage)."""
    from entrypoint.render import checks  # when run only, like entrypoint.local.cluster

    return None if raw is None else checks.number(option, raw, low, high, what, str(low + 1))


def nodes(
    plan: ClusterLayout,
    name: Callable[[int], str],
    *,
    env: Mapping[str, str] = {},  # noqa: B006 - read only
    command: Sequence[str] | None = None,
    log_format: str = "console",
    token: str | None = None,
) -> list[Node]:
    """The node containers: `name(i)` is node i's host name; node 0 is the master. `env` (the
    user's -e) wins over what is set here. The job is named after node 0 and, with `token`
    (a fresh one per run), its nodes prove it at the join (entrypoint.control.transport)."""
    from entrypoint.local.cluster import Node

    master = name(0)
    common = {
        "NNODES": str(plan.nnodes),
        "MASTER_ADDR": master,
        "MASTER_PORT": MASTER_PORT,
        # every node's lines, readable when a person watches: what `local` is for
        "ENTRYPOINT_LOG_ALL_NODES": "true",
        "PYTHONUNBUFFERED": "1",
        "ENTRYPOINT_JOB_ID": master,
    }
    if token:
        common["ENTRYPOINT_JOB_TOKEN"] = token
    if plan.gpus_per_node:
        common["GPUS_PER_NODE"] = str(plan.gpus_per_node)
    else:  # GPUS_PER_NODE must be positive; a CPU node says so in the entrypoint's own setting
        common["ENTRYPOINT_GPUS_PER_NODE"] = "0"
    common["ENTRYPOINT_LOG_FORMAT"] = log_format
    if plan.job != "deepspeed":
        common["ENTRYPOINT_JOB"] = plan.job
    if plan.workers is not None:
        common["ENTRYPOINT_NPROC_PER_NODE"] = str(plan.workers)
    if plan.spares:
        common["ENTRYPOINT_SPARES"] = str(plan.spares)
    if plan.min_nodes is not None:
        common["ENTRYPOINT_MIN_NODES"] = str(plan.min_nodes)
    # The image sets NVIDIA_VISIBLE_DEVICES=all: where the NVIDIA runtime is the default one, a
    # node would see every GPU of the machine unless told its own ("void": none).
    return [
        Node(
            name(rank),
            common
            | {
                "NODE_RANK": str(rank),
                "NVIDIA_VISIBLE_DEVICES": ",".join(plan.gpu_ids[rank]) or "void",
            }
            | dict(env),
            command=("run", "--", *command) if command else None,
            gpus=plan.gpu_ids[rank],
        )
        for rank in range(plan.nnodes)
    ]


def _env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError("--env", pair, "is not VAR=VALUE", "Pass -e ENTRYPOINT_JOB_STEPS=40")
        env[key] = value
    return env


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The `local` subcommand, for the CLI's parser."""
    p = sub.add_parser(
        "local",
        help="run a job as N node containers on this machine (needs Docker)",
        description="Start N node containers of the image on this machine, on a private Docker "
        "network, as hand-started nodes (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT); "
        "give each its share of the GPUs, or CPU workers; stream their logs prefixed "
        "by node; remove everything at the end or on Ctrl-C. Exit 0 when every node "
        "exited 0, 1 when one failed, 2 on bad input. Needs the Docker SDK: "
        "pip install 'multinode-entrypoint[local]'.",
    )
    p.add_argument("--nodes", required=True, metavar="N", help="node containers that train")
    p.add_argument(
        "--spares",
        metavar="S",
        help="standby node containers beside them (ENTRYPOINT_SPARES): `docker kill` a node "
        "and a spare takes its rank",
    )
    p.add_argument(
        "--min-nodes",
        metavar="M",
        help="with no spare left, go on with M nodes or more (ENTRYPOINT_MIN_NODES)",
    )
    p.add_argument(
        "--gpus-per-node",
        metavar="G",
        help="GPUs per node, node i gets GPUs i*G..i*G+G-1 (default: an even share of "
        "this machine's GPUs; 0: CPU)",
    )
    p.add_argument(
        "--workers",
        metavar="W",
        help=f"workers per node (default: one per GPU; {CPU_WORKERS} on CPU)",
    )
    p.add_argument(
        "--image",
        default=os.environ.get("IMAGE", "multinode:dev"),
        help="the image (default: $IMAGE, else multinode:dev)",
    )
    p.add_argument(
        "--job",
        choices=("deepspeed", "jax"),
        default="deepspeed",
        help="the built-in job when no command is given (default deepspeed)",
    )
    _add_demo_options(p)
    _add_run_options(p)
    return p


def _add_demo_options(p: argparse.ArgumentParser) -> None:
    """A node loss to watch, and how the nodes' own lines read."""
    p.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="NODE@STEP",
        help="kill node NODE's container once the job reaches STEP (repeatable), e.g. "
        "--spares 1 --kill 1@30: the loss, the spare's takeover and the resumed training in "
        "one run, summed up at the end; node 0 too (--kill 0@30) with a spare and 3 "
        "containers or more: a survivor takes its place",
    )
    p.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="the nodes' own lines: console (default, readable) or json (one object a line)",
    )


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """What every node gets, how long the run may take, where the reports go, the command."""
    p.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="VAR=VALUE",
        help="set a variable on every node, e.g. -e ENTRYPOINT_JOB_STEPS=40 (repeatable)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=0,
        metavar="SECONDS",
        help="kill the nodes after this long (default 0: no limit)",
    )
    p.add_argument(
        "--results",
        metavar="DIR",
        help="copy every worker's report (<output>/results/rank<R>.json in its node) "
        "to DIR before the containers are removed",
    )
    p.add_argument(
        "trainer",
        nargs=argparse.REMAINDER,
        help="-- CMD ARGS...: run this on every node (default: the built-in job)",
    )


def _layout_of(args: argparse.Namespace, host_gpus: int, gpu_probe: str) -> ClusterLayout:
    """The command line's numbers, each refused in one line, checked against this machine."""
    return layout(
        nnodes=_option("--nodes", args.nodes, 1, MAX_NODES, "the number of node containers") or 0,
        gpus_per_node=_option(
            "--gpus-per-node", args.gpus_per_node, 0, MAX_GPUS, "the GPUs per node"
        ),
        workers=_option("--workers", args.workers, 1, MAX_WORKERS, "the workers per node"),
        job=args.job,
        host_gpus=host_gpus,
        gpu_probe=gpu_probe,
        spares=_option("--spares", args.spares, 0, MAX_NODES - 1, "standby nodes") or 0,
        min_nodes=_option("--min-nodes", args.min_nodes, 1, MAX_NODES, "the fewest nodes"),
    )


def cmd_local(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """The edge: probe, check, talk to Docker, run, report. Returns the exit code."""
    from entrypoint.job.harness import DEFAULT_OUTPUT
    from entrypoint.local import demo
    from entrypoint.supervise import probe  # when run only, like the cluster (see the top)

    command = list(args.trainer or [])
    command = command[1:] if command[:1] == ["--"] else command
    extra = _env_pairs(args.env)
    host_gpus, gpu_probe = probe.gpus()
    plan = _layout_of(args, len(host_gpus), gpu_probe)
    # node 0's loss is survived with spares on 3 containers or more (the job's own etcd)
    kills = demo.parse_kills(args.kill, plan.nnodes, node0=plan.spares > 0 and plan.nnodes >= 3)
    elastic = bool(plan.spares or plan.min_nodes)
    if elastic and not command:
        demo.shared_checkpoints(extra, DEMO_STEPS)
    docker, client = _engine(env, args.image)
    shm = f"{max(1, plan.gpus_per_node)}g"  # at least 1 GB per GPU (docs/IMAGE.md, Run)
    timeout = args.timeout if args.timeout > 0 else float("inf")
    echo = functools.partial(print, flush=True)

    try:
        with demo.KillingCluster(
            args.image,
            kills=kills,
            prefix=f"local-{os.urandom(2).hex()}",
            shm_size=shm,
            echo=echo,
            client=client,
            output=extra.get("ENTRYPOINT_JOB_OUTPUT", DEFAULT_OUTPUT),
            shared=demo.SHARED if elastic else None,
        ) as cluster:
            specs = nodes(
                plan,
                lambda rank: cluster.hostname("node", rank),
                env=extra,
                command=command,
                log_format=args.log_format,
                token=secrets.token_hex(32),
            )
            cluster.names = [spec.name for spec in specs]
            _announce(echo, plan, cluster.network_name, args.image, specs, bool(kills))
            try:
                # with spares a lost node is not the end: the others go on without it
                grace = float("inf") if elastic else 20
                run = cluster.run(specs, timeout=timeout, grace=grace)
            except docker.errors.APIError as err:  # e.g. a GPU request with no NVIDIA runtime
                print(
                    f"entrypoint: error: docker: {err.explanation or err}. Check the image and, "
                    "for GPUs, the NVIDIA container toolkit",
                    file=sys.stderr,
                )
                return EXIT_CONFIG
    except KeyboardInterrupt:  # entrypoint/__main__.py turns it into 128 + N
        print("local: interrupted; containers and network removed", file=sys.stderr)
        raise
    code = demo.verdict(run, args.results, command, elastic, demo.head(run, cluster.names))
    for line in demo.story(run, cluster.killed, cluster.names):
        print(line)
    return code


def _announce(
    echo: Callable[[str], None],
    plan: ClusterLayout,
    network: str,
    image: str,
    specs: list[Node],
    killing: bool,
) -> None:
    """Say what runs where before it starts."""
    per_node = (
        f"{plan.workers} {plan.device.upper()} workers"
        if plan.workers
        else f"{plan.gpus_per_node} GPUs"
        if plan.gpus_per_node
        else "1 process"
    )
    echo(
        f"local: {plan.nnodes} nodes x {per_node} on network {network}, image {image} ({plan.why})"
    )
    for spec in specs:
        if spec.gpus:
            echo(f"local: {spec.name} gets GPUs {','.join(spec.gpus)}")
    if plan.spares or plan.min_nodes:
        echo(
            f"local: {plan.training} nodes train, {plan.spares} stand by"
            + (f", at least {plan.min_nodes} go on" if plan.min_nodes else "")
            + (
                ""
                if killing
                else f"; to see a node lost, in another terminal while it trains: docker kill "
                f"{specs[-1 - plan.spares].name} (or run with --kill 1@30)"
            )
        )


def _engine(env: Mapping[str, str], image: str) -> tuple[ModuleType, DockerClient]:
    """(the Docker SDK, a client of an engine that answers and has `image`)."""
    from entrypoint.local.cluster_docker import sdk  # when run only, as the cluster above

    docker = sdk()
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as err:
        raise ConfigError(
            "DOCKER_HOST",
            env.get("DOCKER_HOST"),
            f"no Docker engine answers ({err})",
            "Start dockerd, or point DOCKER_HOST at one",
        ) from None
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ConfigError(
            "--image",
            image,
            "no such image on this machine",
            "Build it with make image, or pass --image",
        ) from None
    return docker, client


# -- the report at the end ------------------------------------------------------------------------
# What `entrypoint local` says at the end: every worker's report, saved and summed up, and its
# exit code.
