"""Users' launch lines as they write them (`entrypoint run -- torchrun ...`, `-- python -m
torch.distributed.run ...`): the entrypoint becomes the launcher's caller, keeps the script, its
arguments and --nproc-per-node, supplies the node count, rank and master in place of the ones
written, and refuses a node count that disagrees with the platform. Pure reading and planning
here; two real nodes on loopback at the end, each form forming one world of 4."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ports import free_ports
from test_run_real import BASE, CHECK, reports

from conftest import node
from entrypoint.plan import launch_lines
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.node_plan import make_plan

TWO_NODES = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "node-0", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    ("line", "trainer", "nproc"),
    [
        ("torchrun --nproc-per-node=2 train.py --lr 1", ("python", "train.py", "--lr", "1"), 2),
        ("python -m torch.distributed.run --nproc_per_node 2 train.py", ("python", "train.py"), 2),
        ("python3 -u -m torch.distributed.run --nproc_per_node 2 t.py", ("python", "t.py"), 2),
        ("python3 -m torch.distributed.run -m pkg.train", ("python", "-m", "pkg.train"), None),
        ("/opt/venv/bin/torchrun --no-python --nproc-per-node gpu ./run.sh a",
         ("./run.sh", "a"), None),
        ("torchrun --nnodes=2 --node_rank=0 --master_addr=10.0.0.9 train.py",
         ("python", "train.py"), None),
        # the older launcher: with --use-env, torchrun's; without, --local-rank=N first
        ("python -m torch.distributed.launch --nproc_per_node=2 --use-env train.py --lr 1",
         ("python", "train.py", "--lr", "1"), 2),
        ("python3 -m torch.distributed.launch --use_env -m pkg.t", ("python", "-m", "pkg.t"), None),
        ("python -m torch.distributed.launch --nproc_per_node 2 train.py --lr 1",
         (*launch_lines.LOCAL_RANK_FIRST, "python", "train.py", "--lr", "1"), 2),
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


def test_the_older_launchers_options_are_all_known(monkeypatch):
    """torch.distributed.launch's parser is torchrun's with --use-env: the same check."""
    import argparse

    from torch.distributed import launch

    seen: list[argparse.ArgumentParser] = []
    monkeypatch.setattr(
        argparse.ArgumentParser, "parse_args", lambda self, a=None: seen.append(self)
    )
    launch.parse_args([])
    names = {
        longs[0].removeprefix("--")
        for action in seen[0]._actions
        if (longs := [o for o in action.option_strings if o.startswith("--")])
        and longs[0] != "--help"
    }
    assert names == launch_lines.VALUED | launch_lines.LAUNCH_FLAGS


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
        # (torchrun's and python -m torch.distributed.run's plain lines: in the compat suite)
        "torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d "
        "--rdzv-endpoint=10.9.9.9:29400 --rdzv-id=job1 {check}",
        "deepspeed --num_gpus 2 --num_nodes 2 --master_addr 10.9.9.9 {check}",
        # seed 003's line, as its sbatch wrote it for node 0, run as is on both nodes
        "python -m torch.distributed.run --nproc_per_node 2 --nnodes 2 --node_rank 0 "
        "--master_addr 10.0.0.9 --master_port 29500 {check}",
        # the older launcher, as tutorials still write it for node 0: --local-rank=N first
        "python -m torch.distributed.launch --nproc_per_node=2 --nnodes=2 --node_rank=0 "
        "--master_addr=10.0.0.9 {check} --lr 1",
    ],
)
def test_every_form_forms_one_world_across_two_nodes(tmp_path, line):
    port = free_ports(3)
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
    # DeepSpeed's launcher gives its scripts --local_rank=N; torchrun's get their arguments
    local = [
        [f"--local_rank={r['local_rank']}"]
        if line.startswith("deepspeed")
        else [f"--local-rank={r['local_rank']}", "--lr", "1"]
        if "launch " in line
        else []
        for r in got
    ]
    assert [r["argv"] for r in got] == local
    assert all(r["path0"] == str(Path(CHECK).parent) for r in got)


# Seed 004's file: written by `accelerate config` on machine 0 of two, 8 GPUs each.
MACHINE0 = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_config_file: ds_zero3.json
  zero3_init_flag: true
machine_rank: 0
main_process_ip: 10.20.30.40
main_process_port: 29500
mixed_precision: bf16
num_machines: 2
num_processes: 16
rdzv_backend: static
same_network: true
"""
EIGHT_GPUS = TWO_NODES | {"ENTRYPOINT_GPUS_PER_NODE": "8"}


def _with_file(text: str | None):
    return dataclasses.replace(node(0), launch_config=text)


def test_an_accelerate_line_keeps_its_file_and_gets_this_clusters_numbers():
    line = "accelerate launch --config_file cfg.yaml --mixed_precision bf16 train.py --lr 1"
    plan = make_plan(EIGHT_GPUS, _with_file(MACHINE0), line.split())
    assert plan.command[-5:] == ("--mixed_precision", "bf16", "train.py", "--lr", "1")
    assert plan.command[2:4] == ("accelerate.commands.launch", "--config_file")
    written = json.loads(plan.files[plan.command[4]].split("\n", 1)[1])
    # the user's settings kept, the cluster's numbers in place of machine 0's
    assert written["distributed_type"] == "DEEPSPEED" and written["mixed_precision"] == "bf16"
    assert written["deepspeed_config"] == {"deepspeed_config_file": "ds_zero3.json",
                                           "zero3_init_flag": True}  # fmt: skip
    assert (written["machine_rank"], written["main_process_ip"]) == (1, "node-0")
    assert (written["num_machines"], written["num_processes"]) == (2, 16)
    assert plan.nproc_per_node == 8 and plan.world_size == 16
    notes = "\n".join(plan.notes)
    assert "machine_rank in cfg.yaml: 0, main_process_ip in cfg.yaml: 10.20.30.40" in notes
    assert "num_processes in cfg.yaml: 16 agrees" in notes


# The CPU form of seed 004's file: 2 machines, 4 processes.
MULTI_CPU = MACHINE0.replace("DEEPSPEED", "MULTI_CPU").replace("16", "4") + "use_cpu: true\n"


def test_a_multi_cpu_file_runs_the_planned_processes_on_cpu_nodes():
    """With MULTI_CPU accelerate starts one process per machine: on CPU nodes its multi-process
    launcher starts the plan's (gloo, from the site hook), and the plan says so."""
    line = "accelerate launch --config_file cfg.yaml train.py".split()
    plan = make_plan(TWO_NODES, _with_file(MULTI_CPU), line)
    written = json.loads(plan.files[plan.command[4]].split("\n", 1)[1])
    assert (written["distributed_type"], written["use_cpu"]) == ("MULTI_GPU", True)
    assert (written["num_processes"], plan.nproc_per_node, plan.world_size) == (4, 2, 4)
    assert "distributed_type MULTI_CPU run by accelerate's multi-process launcher, 2 per node" in (
        str(plan.sources["accelerate.yaml"])
    )
    # no distributed_type at all: the same on CPU nodes, MULTI_GPU on GPU nodes
    bare = "num_machines: 2\n"
    for env, device_type in ((TWO_NODES, "MULTI_GPU"), (EIGHT_GPUS, "MULTI_GPU")):
        plan = make_plan(env, _with_file(bare), line)
        written = json.loads(plan.files[plan.command[4]].split("\n", 1)[1])
        assert written["distributed_type"] == device_type
    # on GPU nodes a file that asks for CPU processes is refused, naming the setting
    with pytest.raises(ConfigError) as err:
        make_plan(EIGHT_GPUS, _with_file(MULTI_CPU.replace("4", "16")), line)
    said = err.value.line()
    assert "distributed_type in cfg.yaml='MULTI_CPU'" in said and "MULTI_GPU" in said, said


@pytest.mark.parametrize(
    ("line", "text", "env", "says"),
    [
        # the file's num_machines against the platform's node count
        ("accelerate launch --config_file cfg.yaml t.py", MACHINE0.replace(
            "num_machines: 2", "num_machines: 4"), EIGHT_GPUS,
         "num_machines in cfg.yaml='4': but the platform runs 2 nodes (env NNODES). Drop "
         "num_machines in cfg.yaml"),
        # 16 processes on 2 nodes of 4 GPUs
        ("accelerate launch --config_file cfg.yaml t.py", MACHINE0,
         TWO_NODES | {"ENTRYPOINT_GPUS_PER_NODE": "4"}, "asks for 8 GPU workers but this node "
         "has 4 GPUs"),
        # the line's own count wins over the file's, and is checked the same way
        ("accelerate launch --config_file cfg.yaml --num_processes 3 t.py", MACHINE0, EIGHT_GPUS,
         "--num_processes='3': 3 processes on 2 nodes is no whole number per node"),
        ("accelerate launch --config_file cfg.yaml t.py", None, EIGHT_GPUS,
         "--config_file='cfg.yaml': in your accelerate launch line cannot be read on this node"),
        ("accelerate launch --config_file cfg.yaml t.py", "a: [1,", EIGHT_GPUS,
         "is not valid YAML"),
        ("accelerate launch --num_processes 16 t.py", None,
         EIGHT_GPUS | {"ENTRYPOINT_NPROC_PER_NODE": "4"},
         "(16 processes on 2 nodes, 8 a node, but env ENTRYPOINT_NPROC_PER_NODE says 4 a node)"),
    ],
)  # fmt: skip
def test_an_accelerate_line_that_disagrees_is_refused_in_one_line(line, text, env, says):
    with pytest.raises(ConfigError) as err:
        make_plan(env, _with_file(text), line.split())
    assert says in err.value.line(), err.value.line()


def test_accelerate_line_forms_are_read():
    for line in (
        "accelerate launch -m pkg.train --x 1",
        "python -m accelerate.commands.launch --multi_gpu --num_machines=2 t.py",
        "/opt/venv/bin/accelerate launch --no_python ./run.sh a",
    ):
        adopted = launch_lines.read(line.split(), None, 2)
        assert adopted is not None and adopted.kind == "accelerate", line
    assert launch_lines.read("accelerate config".split()) is None
    assert launch_lines.config_file("accelerate launch --config-file=a.yaml t.py".split()) == (
        "a.yaml"
    )
    # a --config_file after the script is the script's own
    assert launch_lines.config_file("accelerate launch t.py --config_file x".split()) is None


@pytest.mark.parametrize(
    ("line", "trainer", "nproc", "replaced"),
    [
        ("deepspeed --num_gpus 2 train.py --deepspeed_config ds.json",
         (*launch_lines.LOCAL_RANK_ARG, "python", "train.py", "--deepspeed_config", "ds.json"),
         2, {}),
        ("deepspeed --hostfile=h -i localhost:0,1 --master_port 6000 --no_local_rank "
         "--module pkg.t",
         ("python", "-m", "pkg.t"), None,
         {"hostfile": "h", "include": "localhost:0,1", "master_port": "6000"}),
        ("python -m deepspeed.launcher.runner --no_python ./run.sh a",
         (*launch_lines.LOCAL_RANK_ARG, "./run.sh", "a"), None, {}),
    ],
)  # fmt: skip
def test_a_deepspeed_line_is_read(line, trainer, nproc, replaced):
    adopted = launch_lines.read(line.split())
    assert adopted is not None and adopted.kind == "deepspeed"
    assert (adopted.trainer, adopted.nproc_per_node, adopted.replaced) == (trainer, nproc, replaced)


def test_a_deepspeed_line_that_disagrees_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        make_plan(TWO_NODES, node(0), "deepspeed --num_nodes 3 t.py".split())
    assert err.value.line().startswith(
        "--num_nodes='3': in your deepspeed line, but the platform runs 2 nodes (env NNODES)"
    )
