"""A launcher inside the command that starts a job of its own (a wrapper calling torchrun's main)
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


def test_a_launcher_called_from_python_stops_every_node(tmp_path):
    """A wrapper that calls torchrun's main() in its own process: no command line names the
    launcher (a start script's is adopted before it starts: test_inner_launcher.py), so the
    world it forms is what shows it."""
    script = tmp_path / "start.sh"
    wrapper = f"from torch.distributed.run import main; main(['--nproc-per-node=2', '{DDP}'])"
    script.write_text(f'#!/bin/bash\nexec python -c "{wrapper}"\n')
    port = free_ports(3)
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
            [sys.executable, "-m", "entrypoint", "run", "--", "bash", str(script)],
            env=env | {"NODE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outputs[0][-3000:]
    stop = [line for line in outputs[0].splitlines() if "stopping every node (exit 2)" in line]
    assert stop and MISMATCH in stop[0], outputs[0][-3000:]
