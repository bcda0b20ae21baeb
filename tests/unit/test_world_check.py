"""A trainer inside the command that starts a job of its own (its own processes and master)
never trains on the wrong world: the site hook compares the world the trainer forms with the
plan, and every node stops with exit 2 and one line saying what to write instead."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ports import free_ports

from entrypoint.trainer_side.world_check import MISMATCH, mismatch

DDP = Path(__file__).parents[1] / "trainers" / "ddp_tutorial.py"


@pytest.mark.parametrize(
    ("world", "rank", "plan", "wrong"),
    [
        (4, 2, (4, 2, 2, 3), False),  # the planned world, a rank of this node
        (2, 1, (4, 2, 2, 3), True),  # an inner torchrun's own world of 2
        (2, 0, (2, 2, 1, 1), True),  # the same size, but another node's rank
        (1, 0, (1, 1, 0, 0), False),
    ],
)
def test_the_world_formed_against_the_plan(world, rank, plan, wrong):
    line = mismatch(world, rank, plan)
    assert (line is not None) == wrong
    if line:
        assert line.startswith(MISMATCH) and "entrypoint run -- python train.py" in line


# A trainer that starts its own processes and sets its own master, as torch's DDP tutorial
# first did (`mp.spawn`, MASTER_ADDR=localhost): each node forms a world of its own.
SPAWNS = """import os, sys, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
"""


def test_a_trainer_that_starts_its_own_world_stops_every_node(tmp_path):
    """No command line names a launcher (one that does, or torchrun's agent called from Python,
    is adopted before it starts: test_inner_launcher.py), so the world it forms is what shows
    it: node 1's processes formed ranks 0-1 of a world of 2, the ranks of node 0."""
    script = tmp_path / "spawns.py"
    script.write_text(SPAWNS)
    port, own = free_ports(3), free_ports(2)
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/tmp"),
        "NNODES": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "ENTRYPOINT_GPUS_PER_NODE": "0",
        "ENTRYPOINT_NPROC_PER_NODE": "1",
        "ENTRYPOINT_SOCKET_IFNAME": "lo",
        "ENTRYPOINT_RUN_DIR": str(tmp_path / "run"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "entrypoint", "run", "--", "python", str(script),
             str(own + rank)],
            env=env | {"NODE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]  # fmt: skip
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outputs[0][-3000:] + outputs[1][-3000:]
    stop = [line for line in outputs[0].splitlines() if "stopping every node (exit 2)" in line]
    assert stop and MISMATCH in stop[0], outputs[0][-3000:]
