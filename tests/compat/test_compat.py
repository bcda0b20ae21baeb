"""Users' own trainers, unmodified, in real node containers (issue 13): each trainer in
tests/trainers/ is written as its library's public documentation shows it, not against this
project, and runs through `entrypoint run` on 2 node containers x 2 CPU workers (JAX: 1 process
per node) under the four platform conventions of tests/cluster/test_cluster.py: a container
platform's WORLD_SIZE = nodes, hand-started nodes' NNODES/NODE_RANK, SLURM's variables (one
task per node), Kubeflow PyTorchJob's. The trainers are this repository's tests/trainers/,
mounted read-only at /workspace as a user mounts code (`-v "$PWD":/workspace`); Lightning comes
in a derived image (tests/compat/Dockerfile.lightning).

Checked: both containers exit 0, and every rank printed the trainer's own success line, on the
node the convention puts it, with the job's world size (plus what each trainer proves: equal
weights after DDP, a psum over every process, ...).

By default every trainer runs under every convention (20 jobs, and FSDP2 under one);
COMPAT_MATRIX=quick (CI's, for its time) runs every trainer under one convention and every
convention under DDP and JAX (11 jobs: DDP under a container platform's variables is its
`torchrun` line's job, QUICK_LEAVES), the hangs, and the launch lines but `python -m
torch.distributed.run`'s; COMPAT_MATRIX=smoke (CI's on the CUDA 13 image, beside the run on the
default one) runs torch DDP, accelerate, the Hugging Face Trainer with DeepSpeed and JAX under
one convention, one hang, and the torchrun and deepspeed launch lines (8 tests; the CUDA 13
tier leaves the start script to the default image's run: what it proves is the entrypoint's,
not the stack's).

Across node 0's loss (3 nodes, a spare, node 0 killed), a DDP trainer written as torchrun's
documentation asks (tests/trainers/ddp_elastic.py) and the Hugging Face Trainer with DeepSpeed
resume from their own checkpoints on a shared volume: both in the full matrix, DDP else (the
CUDA 13 tier leaves it: the takeover is the entrypoint's).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from cluster.test_cluster import STYLES, TWO_WORKERS
from cluster.test_slurm import _ca_bundle, _docker_cli
from entrypoint.local.cluster import LABEL, ClusterRun, Node
from faulty_cluster import Fault, FaultyCluster
from trainers.user_lines import LAUNCH_LINES, SCRIPTS, WORKSPACE

ROOT = Path(__file__).parents[2]
TRAINERS = ROOT / "tests" / "trainers"
TIMEOUT = 300  # per cluster: a case takes ~30-90 s on 2 shared cores


@dataclass(frozen=True)
class Trainer:
    """A user's trainer: its command after `entrypoint run --`, the line every rank prints when
    it is done (named groups `rank` and `world`), what it needs set, and workers per node."""

    command: tuple[str, ...]
    done: re.Pattern
    env: dict[str, str] = field(default_factory=dict)
    per_node: int = 2
    derived: bool = False  # runs in the derived image (Lightning)
    check: Callable[[list[re.Match]], None] | None = None  # on every rank's success line
    node0_says: tuple[str, ...] = ()  # lines the library itself prints once, at global rank 0


def same_weights(lines: list[re.Match]) -> None:
    sums = {m["checksum"] for m in lines}
    assert len(sums) == 1, f"DDP ranks ended with different weights: {sums}"


def every_device_summed(lines: list[re.Match]) -> None:
    for m in lines:
        assert int(m["psum"]) == int(m["world"]), m[0]  # one CPU device per process
        assert m["gathered"] == ", ".join(str(i) for i in range(int(m["world"]))), m[0]


def deepspeed_evaluated_all(lines: list[re.Match]) -> None:
    for m in lines:
        assert m["type"] == "DistributedType.DEEPSPEED", m[0]
        assert int(m["examples"]) == 100, m[0]  # gather_for_metrics drops the padding


def multi_cpu_evaluated_all(lines: list[re.Match]) -> None:
    for m in lines:
        assert m["type"] == "DistributedType.MULTI_CPU", m[0]  # gloo, one world of the plan's
        assert int(m["examples"]) == 100, m[0]


def same_step(lines: list[re.Match]) -> None:
    steps = {int(m["steps"]) for m in lines}
    assert len(steps) == 1 and steps.pop() > 0, steps


def python(script: str, *args: str) -> tuple[str, ...]:
    return ("python", f"{WORKSPACE}/{script}", *args)


TRAINER_SHAPES = {
    "ddp": Trainer(
        python("ddp_tutorial.py"),
        re.compile(
            r"Finished running basic DDP example on rank (?P<rank>\d+) of (?P<world>\d+) "
            r"\(weights checksum (?P<checksum>\S+)\)"
        ),
        check=same_weights,
    ),
    "accelerate": Trainer(
        python("accelerate_quicktour.py"),
        re.compile(
            r"accelerate quick tour: process (?P<rank>\d+) of (?P<world>\d+) "
            r"\((?P<type>\S+)\) evaluated (?P<examples>\d+) examples"
        ),
        env={"ENTRYPOINT_LAUNCHER": "accelerate"},
        check=deepspeed_evaluated_all,
    ),
    # engineer ops's trainer (tests/image/test_deepspeed_ops.py runs it in one container)
    "hf_trainer": Trainer(
        python(
            "hf_trainer.py",
            "--deepspeed",
            f"{WORKSPACE}/ds_config_zero2.json",
            "--output_dir",
            "/tmp/hf-trainer",
            "--max_steps",
            "4",
            "--per_device_train_batch_size",
            "2",
            "--save_strategy",
            "no",
            "--report_to",
            "none",
        ),
        re.compile(
            r"hf_trainer: rank (?P<rank>\d+) of (?P<world>\d+) trained (?P<steps>\d+) "
            r"steps with DeepSpeedEngine and FusedAdam"  # the image's prebuilt op, no build
        ),
        check=same_step,
        node0_says=("hf_trainer: done, loss",),
    ),
    "jax": Trainer(
        python("jax_multiprocess.py"),
        re.compile(
            r"jax multi-process: process (?P<rank>\d+) of (?P<world>\d+), "
            r"psum (?P<psum>\d+), allgather \[(?P<gathered>[\d, ]*)\]"
        ),
        env={"ENTRYPOINT_LAUNCHER": "jax"},
        per_node=1,
        check=every_device_summed,
    ),
    # The same, one JAX process per worker: the default launcher (torchrun) starts 2 a node,
    # and the site hook gives JAX torchrun's numbers (trainer_side/jax_cluster.py)
    "jax_per_worker": Trainer(
        python("jax_multiprocess.py"),
        re.compile(
            r"jax multi-process: process (?P<rank>\d+) of (?P<world>\d+), "
            r"psum (?P<psum>\d+), allgather \[(?P<gathered>[\d, ]*)\]"
        ),
        check=every_device_summed,
        node0_says=("4 processes (torchrun's WORLD_SIZE)",),
    ),
    "fsdp2": Trainer(
        python("fsdp2_trainer.py"),
        re.compile(r"fsdp2: rank (?P<rank>\d+) of (?P<world>\d+) trained (?P<steps>\d+) steps"),
        check=same_step,
    ),
    "lightning": Trainer(
        python("lightning_multinode.py"),
        re.compile(
            r"lightning: global rank (?P<rank>\d+) of (?P<world>\d+) \(node \d+, "
            r"local rank \d+\) finished (?P<steps>\d+) steps"
        ),
        derived=True,
        check=same_step,
    ),
}

# COMPAT_MATRIX=quick leaves two jobs whose every check another of its jobs makes:
# - DDP under a container platform's variables: the `torchrun` line under the same convention
#   runs the same trainer with the same checks, and the other trainers under it run through the
#   torchrun the entrypoint builds;
# - the `python -m torch.distributed.run` line under SLURM: tests/unit/test_launch_lines.py forms
#   a world of 4 with that form on two nodes, and DDP under SLURM is a job of its own here.
QUICK_LEAVES = (("ddp", "commercial"), ("python -m torch.distributed.run", "slurm"))
# COMPAT_MATRIX=smoke (a second image): a user's torchrun line under PyTorchJob (whose PET_*
# variables torchrun itself reads) and DeepSpeed's launcher
SMOKE_LINES = (("torchrun", "pytorchjob"), ("deepspeed", "slurm"))

JAX_SPLIT = {("jax", "commercial"), ("jax", "pytorchjob"), ("jax_per_worker", "slurm"),
             ("jax_per_worker", "torchrun")}  # fmt: skip
# Which trainer under which convention (see the module's docstring).
MATRIX = os.environ.get("COMPAT_MATRIX", "full")
CASES = [
    (t, c)
    for t in TRAINER_SHAPES
    for c in STYLES
    if (
        c == "commercial" and t in ("ddp", "accelerate", "hf_trainer", "jax")
        if MATRIX == "smoke"
        else (MATRIX != "quick" and t != "fsdp2")
        or (c == "commercial" or t in ("ddp", "jax", "jax_per_worker"))
        and (MATRIX != "quick" or (t, c) not in QUICK_LEAVES)
    )
    # JAX: one process a node under SLURM's and torchrun's names, one a worker under the
    # container platform's and PyTorchJob's
    and (MATRIX == "smoke" or (t, c) not in JAX_SPLIT)
]


def nodes_for(cluster: FaultyCluster, convention: str, trainer: Trainer) -> list[Node]:
    """The convention's two nodes, running the trainer. A JAX job is one process per node: no
    ENTRYPOINT_NPROC_PER_NODE, and a PyTorchJob with nprocPerNode 1."""
    nodes = STYLES[convention](cluster)
    if trainer.per_node == 1:
        one = {"WORLD_SIZE": "2", "PET_NPROC_PER_NODE": "1"} if convention == "pytorchjob" else {}
        nodes = [
            Node(n.name, {k: v for k, v in n.env.items() if k not in TWO_WORKERS} | one)
            for n in nodes
        ]
    return [
        Node(n.name, dict(n.env) | trainer.env, command=("run", "--", *trainer.command))
        for n in nodes
    ]


def assert_every_rank_done(run: ClusterRun, trainer: Trainer) -> None:
    run.check()
    world = 2 * trainer.per_node
    done = []
    for index, node_run in enumerate(run.nodes):
        # Workers of a node share its stdout; with PYTHONUNBUFFERED (the image's) print writes
        # the text and its newline apart, so two ranks' lines can arrive as one: "A.B.\n\n".
        found = [m for line in node_run.lines for m in trainer.done.finditer(line)]
        ranks = sorted(int(m["rank"]) for m in found)
        expected = list(range(index * trainer.per_node, (index + 1) * trainer.per_node))
        assert ranks == expected, (
            f"node {index} ({node_run.name}): success lines of ranks "
            f"{ranks}, expected {expected}\n{run.log(80)}"
        )
        assert {int(m["world"]) for m in found} == {world}, [m[0] for m in found]
        done += found
    if trainer.check is not None:
        trainer.check(done)
    for text in trainer.node0_says:
        assert any(text in line for line in run.nodes[0].lines), f"node 0 never said {text!r}"


@pytest.fixture(scope="module")
def derived_image(image, docker_client):
    """tests/compat/Dockerfile.lightning FROM the image, under a tag of this module's own,
    removed at the end (BuildKit's cache keeps the layer: the next build takes seconds)."""
    tag = f"multinode-lightning:test-{secrets.token_hex(3)}"
    ca = _ca_bundle()
    command = [
        _docker_cli(),
        "build",
        "-q",
        "-f",
        str(ROOT / "tests/compat/Dockerfile.lightning"),
        "--build-arg",
        f"IMAGE={image}",
        "--label",
        f"{LABEL}=compat-test",
        "-t",
        tag,
        *(["--secret", f"id=ca,src={ca}"] if ca else []),
        str(ROOT),
    ]
    began = time.monotonic()
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=900,
        env=os.environ | {"DOCKER_BUILDKIT": "1"},
    )
    if out.returncode != 0:
        pytest.fail(
            f"building {tag} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}", pytrace=False
        )
    print(f"built {tag} from {image} in {time.monotonic() - began:.1f} s")
    yield tag
    from docker.errors import APIError, NotFound

    try:
        docker_client.images.remove(tag)
    except (NotFound, APIError) as err:
        print(f"could not remove {tag}: {err}")


@pytest.mark.parametrize(("shape", "convention"), CASES)
def test_users_trainer_runs_unmodified(request, docker_client, image, shape, convention):
    trainer = TRAINER_SHAPES[shape]
    tag = request.getfixturevalue("derived_image") if trainer.derived else image
    with FaultyCluster(
        tag, client=docker_client, echo=print, mounts={str(TRAINERS): WORKSPACE}
    ) as c:
        run = c.run(nodes_for(c, convention, trainer), timeout=TIMEOUT)
        assert_every_rank_done(run, trainer)
        print(f"compat {shape} x {convention}: {run.seconds:.1f} s")


HUNG = {  # a rank hangs inside its optimizer step: tests/hang_wrapper.py runs the trainer as is
    "hf_trainer": "2",
    "accelerate": "2",
    "fsdp2": "3",
}


@pytest.mark.parametrize("shape", ["hf_trainer"] if MATRIX == "smoke" else sorted(HUNG))
def test_a_hang_inside_a_users_trainer_is_named(docker_client, image, shape):
    """Rank 3 (node 1) sleeps inside an optimizer step of the Hugging Face Trainer with
    DeepSpeed, accelerate's quick tour or an FSDP2 trainer: node 0 names it with its stack and
    the collective it never entered, and every node exits 124, within ENTRYPOINT_HANG_TIMEOUT
    and a few seconds."""
    trainer = TRAINER_SHAPES[shape]
    command = ("python", "/tests/hang_wrapper.py", *trainer.command[1:])
    hang = {"ENTRYPOINT_HANG_TIMEOUT": "15", "HANG_RANK": "3", "HANG_STEP": HUNG[shape]}
    mounts = {str(TRAINERS): WORKSPACE, str(ROOT / "tests"): "/tests"}
    with FaultyCluster(image, client=docker_client, echo=print, mounts=mounts) as c:
        nodes = [
            Node(n.name, dict(n.env) | hang, command=("run", "--", *command))
            for n in nodes_for(c, "commercial", trainer)
        ]
        run = c.run(nodes, timeout=TIMEOUT)
        assert [n.exit_code for n in run.nodes] == [124, 124], run.log(80)
        line = next(x for x in run.nodes[0].lines if "stopping every node (exit 124)" in x)
        assert "rank 3 on node 1" in line and "hang_wrapper.py" in line, line
        # torch's Flight Recorder, read in the user's ranks: the collective the others entered
        assert "Flight Recorder: rank 3 never entered collective #" in line, line
        print(f"compat hang {shape}: {run.seconds:.1f} s; {line[line.index('Flight') :][:200]}")


# Users' launch lines as they write them (docs/your-trainer.md, "Your launch line").
# DeepSpeed's getting started, launched by a user's `deepspeed` line (LAUNCH_LINES) only: it
# reads --local_rank, which DeepSpeed's launcher gives
DEEPSPEED_TUTORIAL = Trainer(
    python("deepspeed_tutorial.py"),
    re.compile(
        r"deepspeed tutorial: rank (?P<rank>\d+) of (?P<world>\d+) local_rank \d+ took "
        r"(?P<steps>\d+) steps \(weights checksum (?P<checksum>\S+)\)"
    ),
    check=same_weights,
)
TRAINER_OF_LINE = {
    "accelerate launch": TRAINER_SHAPES["accelerate"],
    "accelerate launch multi-cpu": replace(
        TRAINER_SHAPES["accelerate"], check=multi_cpu_evaluated_all
    ),
    "deepspeed": DEEPSPEED_TUTORIAL,
}


LAUNCH_CASES = [
    ("torchrun", "commercial"),
    ("python -m torch.distributed.run", "slurm"),
    ("torchrun", "pytorchjob"),
    ("accelerate launch", "commercial"),
    ("accelerate launch multi-cpu", "pytorchjob"),
    ("python -m torch.distributed.launch", "slurm"),
    ("deepspeed", "slurm"),
] + (  # the full matrix: the older launcher and the MULTI_CPU file under every convention
    [("python -m torch.distributed.launch", c) for c in ("commercial", "pytorchjob")]
    + [("accelerate launch multi-cpu", c) for c in ("commercial", "slurm")]
    if MATRIX == "full"
    else []
)


@pytest.mark.parametrize(
    ("form", "convention"),
    [
        f
        for f in LAUNCH_CASES
        if (MATRIX != "smoke" or f in SMOKE_LINES) and (MATRIX != "quick" or f not in QUICK_LEAVES)
    ],
)
def test_a_users_launch_line_forms_one_world(docker_client, image, form, convention):
    """`entrypoint run -- torchrun --nproc-per-node=2 ddp_tutorial.py` on 2 node containers:
    the entrypoint adopts the line, and every rank trains in one world of 4. The same with
    `accelerate launch --config_file` and a file written for machine 0 of another cluster."""
    trainer = TRAINER_OF_LINE.get(form, TRAINER_SHAPES["ddp"])
    with FaultyCluster(
        image, client=docker_client, echo=print, mounts={str(TRAINERS): WORKSPACE}
    ) as c:
        nodes = [
            Node(n.name, dict(n.env), command=("run", "--", *LAUNCH_LINES[form]))
            for n in nodes_for(c, convention, trainer)
        ]
        run = c.run(nodes, timeout=TIMEOUT)
        assert_every_rank_done(run, trainer)
        print(f"launch line {form} x {convention}: {run.seconds:.1f} s")


# A start script with its own launcher (trainers/user_lines.py's SCRIPTS), run as `entrypoint
# run -- bash SCRIPT`; each under which conventions, and the trainer's shape (the CUDA 13 tier
# leaves them: Makefile's CU13_LEAVE). The quick matrix leaves start.sh, whose form (a torchrun
# with no node values) the loopback test runs (tests/unit/test_inner_launcher.py).
SCRIPT_SHAPES = dict(zip(SCRIPTS, ("ddp", "ddp", "accelerate launch multi-cpu", "deepspeed")))
START_SCRIPTS = (
    [(s, c, t) for s, t in SCRIPT_SHAPES.items() for c in ("commercial", "slurm", "pytorchjob")]
    if MATRIX == "full"
    else [
        ("outer.sh", "slurm", "ddp"),
        ("start_accelerate.sh", "pytorchjob", "accelerate launch multi-cpu"),
        ("start_deepspeed.sh", "commercial", "deepspeed"),
    ]
)


@pytest.mark.parametrize(("script", "convention", "shape"), START_SCRIPTS)
def test_a_start_scripts_own_launcher_is_adopted_and_trains_as_one_world(
    docker_client, image, script, convention, shape
):
    """The launcher inside the script is adopted where it runs (the site hook in the image's
    venv): the cluster's numbers in place of those written there, once a node, and every rank
    trains in one world of 4."""
    trainer = TRAINER_OF_LINE.get(shape, TRAINER_SHAPES["ddp"])
    with FaultyCluster(
        image, client=docker_client, echo=print, mounts={str(TRAINERS): WORKSPACE}
    ) as c:
        nodes = [
            Node(n.name, dict(n.env), command=("run", "--", "bash", f"{WORKSPACE}/{script}"))
            for n in nodes_for(c, convention, replace(trainer, env={}))  # the default launcher
        ]
        run = c.run(nodes, timeout=TIMEOUT)
        assert_every_rank_done(run, trainer)
        for index, node in enumerate(run.nodes):
            said = [x for x in node.lines if "entrypoint: adopted" in x]
            assert len(said) == 1, run.log(60)  # once a node
            assert f"2 nodes x 2 processes, node rank {index}" in said[0], said
            if script == "outer.sh":
                assert "--master_addr=old-host.invalid -> " in said[0], said
                assert "`bash /workspace/start_machine0.sh`'s torchrun" in said[0], said
                assert any("start_machine0.sh: done" in x for x in node.lines), run.log(60)
            if script == "start_accelerate.sh":
                assert "main_process_ip: 10.20.30.40 in accelerate_multi_cpu.yaml -> " in said[0]
                assert "run by accelerate's multi-process launcher" in said[0], said
            if script == "start_deepspeed.sh":
                assert "--hostfile=/job/hostfile -> (dropped)" in said[0], said
                assert "run by torchrun with --local_rank=N" in said[0], said
        print(f"start script {script} x {convention}: {run.seconds:.1f} s")


# Users' trainers that resume from their own checkpoint, across node 0's loss (issue 50): the
# trainer, the line of rank 0's at which node 0 is killed, the line it says when it resumes,
# and every rank's last line (named groups `rank` and `world`).
SHARED = "/shared"
RESUMING = {
    "ddp": (
        python("ddp_elastic.py", "--checkpoint", f"{SHARED}/ddp.pt", "--steps", "250"),
        "ddp_elastic: step 50/",
        "ddp_elastic: resumed from step ",
        re.compile(
            r"ddp_elastic: rank (?P<rank>\d+) of (?P<world>\d+) finished 250 steps, resumed "
            r"from step [1-9]\d* \(weights checksum (?P<checksum>\S+)\)"
        ),
    ),
    "hf_trainer": (
        python(
            "hf_trainer.py",
            "--deepspeed",
            f"{WORKSPACE}/ds_config_zero2.json",
            "--output_dir",
            f"{SHARED}/hf-trainer",
            "--max_steps",
            "120",
            "--per_device_train_batch_size",
            "2",
            "--save_strategy",
            "steps",
            "--save_steps",
            "20",
            "--logging_steps",
            "25",  # its first log between two checkpoints: the kill never cuts one in half
            "--report_to",
            "none",
        ),
        "{'loss'",
        f"hf_trainer: resuming from {SHARED}/hf-trainer/checkpoint-",
        re.compile(
            r"hf_trainer: rank (?P<rank>\d+) of (?P<world>\d+) trained 120 steps with "
            r"DeepSpeedEngine"
        ),
    ),
}


@pytest.mark.parametrize(
    "shape", sorted(RESUMING) if MATRIX == "full" else ["ddp"]
)  # fmt: skip
def test_a_users_trainer_resumes_after_node_0_is_lost(docker_client, image, shape):
    """3 node containers with a container platform's variables only (WORLD_SIZE nodes, RANK,
    MASTER_ADDR; 2 workers each, a spare), no etcd named: node 0 is `docker kill`ed while the
    user's trainer trains. A survivor takes node 0's seat in the job's
    own etcd, and the trainer, unmodified, starts again on the two nodes left with its
    rendezvous on the new node 0, resumes from its own checkpoint on the shared volume, and
    finishes; the survivors exit 0."""
    command, trigger, resumed, done = RESUMING[shape]
    with FaultyCluster(
        image, client=docker_client, echo=print, shared=SHARED, mounts={str(TRAINERS): WORKSPACE}
    ) as c:
        n = [c.hostname("worker", r) for r in range(3)]
        env = {
            "WORLD_SIZE": "3",
            "MASTER_ADDR": n[0],
            "MASTER_PORT": "29500",
            "ENTRYPOINT_SPARES": "1",
            "ENTRYPOINT_JOB_TOKEN": secrets.token_hex(16),
        } | TWO_WORKERS
        nodes = [
            Node(name, env | {"RANK": str(r)}, command=("run", "--", *command))
            for r, name in enumerate(n)
        ]
        fault = Fault("kill0", lambda c: c.kill(n[0]), node=n[0], line=trigger)
        run = c.run(nodes, timeout=TIMEOUT, grace=float("inf"), faults=[fault])
        assert run.exit_codes == {n[0]: 137, n[1]: 0, n[2]: 0}, run.log(120)
        found = [m for name in n[1:] for line in run.node(name).lines for m in done.finditer(line)]
        assert sorted(int(m["rank"]) for m in found) == [0, 1, 2, 3], run.log(120)
        assert {int(m["world"]) for m in found} == {4}, [m[0] for m in found]
        assert any(resumed in x for name in n[1:] for x in run.node(name).lines), run.log(120)
        if "checksum" in done.groupindex:
            same_weights(found)
        said = next(x for x in run.lines if "is node 0 from restart 1" in x)
        said = said[said.index("node 0 (") :].split('"')[0]
        lost = run.faults["kill0"]
        back = min(t for name in n[1:] if (t := run.node(name).when(resumed)) is not None)
        print(
            f"compat {shape} across node 0's loss: {run.seconds:.1f} s; resumed "
            f"{back - lost:.1f} s after the kill; {said}"
        )
