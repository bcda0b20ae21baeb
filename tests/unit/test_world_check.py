"""A trainer inside the command that starts a job of its own (its own processes and master)
never trains on the wrong world: the site hook compares the world the trainer forms with the
plan, and every node stops with exit 2 and one line saying what to write instead."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ports import free_ports

from entrypoint.trainer_side.world_check import ELSEWHERE, MISMATCH, elsewhere, mismatch

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


@pytest.mark.parametrize(
    ("init_method", "env", "wrong"),
    [
        (None, {"MASTER_ADDR": "w0", "MASTER_PORT": "29500"}, False),
        ("env://", {"MASTER_ADDR": "old-host", "MASTER_PORT": "29500"}, True),
        (None, {"MASTER_ADDR": "w0", "MASTER_PORT": "12355"}, True),
        ("tcp://old-host:29500", {}, True),
        ("tcp://w0:29500?timeout=9", {}, False),
        ("file:///shared/rdzv", {}, False),  # the trainer's own way: not judged
    ],
)
def test_a_master_the_trainer_set_itself_is_named(init_method, env, wrong):
    line = elsewhere(init_method, env, ("w0", "29500"))
    assert (line is not None) == wrong
    if line:
        assert line.startswith(ELSEWHERE) and "this job's is w0:29500" in line, line
    assert elsewhere(init_method, env, None) is None  # no master given: nothing to compare


STALE = """import os, torch.distributed as dist
os.environ["MASTER_ADDR"] = "old-host.invalid"  # written for a cluster long gone
dist.init_process_group("gloo")
"""


def _two_nodes(tmp_path: Path, *command: str) -> tuple[list[str], list[int], float]:
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
    began = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "entrypoint", "run", "--", *command],
            env=env | {"NODE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:  # a node still running at the timeout is not left behind (its trainers die with it)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outputs, [p.returncode for p in procs], time.monotonic() - began


def test_a_trainer_that_sets_a_stale_master_stops_every_node_at_once(tmp_path):
    """MASTER_ADDR written over by the trainer: its group would wait 30 minutes for a master
    nobody serves; every node stops with exit 2 and one line, within seconds."""
    script = tmp_path / "stale.py"
    script.write_text(STALE)
    outputs, codes, took = _two_nodes(tmp_path, "python", str(script))
    assert codes == [2, 2], outputs[0][-3000:] + outputs[1][-3000:]
    assert took < 60, took
    stop = [line for line in outputs[0].splitlines() if "stopping every node (exit 2)" in line]
    assert stop and ELSEWHERE in stop[0], outputs[0][-3000:]
    assert "MASTER_ADDR=old-host.invalid" in stop[0] and "this job's is 127.0.0.1:" in stop[0]


def test_a_trainer_that_starts_its_own_world_stops_every_node(tmp_path):
    """No command line names a launcher (one that does, or torchrun's agent called from Python,
    is adopted before it starts: test_inner_launcher.py), so the world it forms is what shows
    it: node 1's processes ask for ranks 0-1 of a world of 2, the ranks of node 0, and are refused
    before their group forms."""
    script = tmp_path / "spawns.py"
    script.write_text(SPAWNS)
    outputs, codes, _ = _two_nodes(tmp_path, "python", str(script), str(free_ports(2)))
    assert codes == [2, 2], outputs[0][-3000:] + outputs[1][-3000:]
    stop = [line for line in outputs[0].splitlines() if "stopping every node (exit 2)" in line]
    # whichever process is refused first: another node's rank (MISMATCH), or rank 0 of node 0,
    # whose rank is its own, at a master of its own (ELSEWHERE)
    assert stop and (MISMATCH in stop[0] or ELSEWHERE in stop[0]), outputs[0][-3000:]
