"""Users' launch lines as they write them (`entrypoint run -- torchrun ...`, `-- python -m
torch.distributed.run ...`): the entrypoint becomes the launcher's caller, keeps the script, its
arguments and --nproc-per-node, supplies the node count, rank and master in place of the ones
written, and refuses a node count that disagrees with the platform. Pure reading and planning
here; two real nodes on loopback at the end, each form forming one world of 4."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hang_real import three_free_ports
from test_run_real import BASE, CHECK, reports

from conftest import node
from entrypoint.plan import launch_lines
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.plan import make_plan

TWO_NODES = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "node-0", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    ("line", "trainer", "nproc"),
    [
        ("torchrun --nproc-per-node=2 train.py --lr 1", ("python", "train.py", "--lr", "1"), 2),
        ("python -m torch.distributed.run --nproc_per_node 2 train.py", ("python", "train.py"), 2),
        ("python3 -m torch.distributed.run -m pkg.train", ("python", "-m", "pkg.train"), None),
        ("/opt/venv/bin/torchrun --no-python --nproc-per-node gpu ./run.sh a",
         ("./run.sh", "a"), None),
        ("torchrun --nnodes=2 --node_rank=0 --master_addr=10.0.0.9 train.py",
         ("python", "train.py"), None),
    ],
)  # fmt: skip
def test_a_launch_line_is_read(line, trainer, nproc):
    adopted = launch_lines.read(line.split())
    assert adopted is not None
    assert (adopted.trainer, adopted.nproc_per_node) == (trainer, nproc)


@pytest.mark.parametrize(
    "command", [["python", "train.py"], ["bash", "start.sh"], ["python", "-m", "pkg"], []]
)
def test_other_commands_are_not_launch_lines(command):
    assert launch_lines.read(command) is None


def test_torchruns_options_are_all_known():
    """The options list against torch's own parser, so that a new torchrun option is known."""
    from torch.distributed.run import get_args_parser

    names = set()
    for action in get_args_parser()._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and longs[0] != "--help":
            names.add(longs[0].removeprefix("--"))
    assert names == launch_lines.VALUED | launch_lines.FLAGS


def test_the_plan_keeps_the_script_and_the_workers_and_replaces_the_rest():
    line = "torchrun --nnodes 2 --node_rank 0 --master_addr 10.0.0.9 --nproc-per-node 2 t.py --x"
    plan = make_plan(TWO_NODES, node(0), line.split())
    assert plan.command[-2:] == ("t.py", "--x") and "--node-rank=1" in plan.command
    assert "--master-addr=node-0" in plan.command and plan.nproc_per_node == 2
    assert plan.world_size == 4
    assert any("--node-rank 0, --master-addr 10.0.0.9: replaced" in n for n in plan.notes)


@pytest.mark.parametrize(
    ("line", "env", "says"),
    [
        ("torchrun --nnodes 4 t.py", {}, "the platform runs 2 nodes"),
        ("torchrun --nproc-per-node 4 t.py", {"ENTRYPOINT_NPROC_PER_NODE": "2"},
         "env ENTRYPOINT_NPROC_PER_NODE says 2"),
        ("torchrun --bogus 1 t.py", {}, "is not an option torchrun knows"),
        ("torchrun --nproc-per-node", {}, "takes a value"),
        ("torchrun --nproc-per-node 2", {}, "names no script"),
    ],
)  # fmt: skip
def test_a_line_that_disagrees_is_refused_in_one_line(line, env, says):
    with pytest.raises(ConfigError) as err:
        make_plan(TWO_NODES | env, node(0), line.split())
    assert says in err.value.line()


@pytest.mark.parametrize(
    "line",
    [
        "torchrun --nproc-per-node=2 {check}",
        "python -m torch.distributed.run --nproc_per_node 2 {check}",
        "torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d "
        "--rdzv-endpoint=10.9.9.9:29400 --rdzv-id=job1 {check}",
    ],
)
def test_every_form_forms_one_world_across_two_nodes(tmp_path, line):
    port = three_free_ports()
    command = line.format(check=CHECK).split()
    env = BASE | {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "NNODES": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "ENTRYPOINT_SOCKET_IFNAME": "lo",
        "ALLREDUCE_OUT": str(tmp_path),
        "ENTRYPOINT_RUN_DIR": str(tmp_path / "run"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "entrypoint", "run", "--", *command],
            env=env | {"NODE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (1, 0)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    got = reports(tmp_path)
    assert [r["rank"] for r in got] == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["sum"] == 10.0 for r in got)
