"""A launcher started inside the command (a start script running torchrun, deepspeed or
accelerate, at any depth) is adopted before it reads its options: the cluster's numbers replace
those written there, and the nodes train as one world. One that cannot be adopted (outside a
planned launch's numbers, an accelerate config file that cannot be read) stops in one line
naming it and the script that started it; every node stops with exit 2, the line last, and
nothing hangs. A launch line given to the entrypoint itself is adopted by the plan
(test_launch_lines.py). accelerate's own launcher runs in the image (tests/compat)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ports import free_ports

from entrypoint.trainer_side import inner_launcher
from entrypoint.trainer_side.inner_launcher import REFUSED

HOOK = str(Path(inner_launcher.__file__).parent / "site-hook")
PY = sys.executable


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        ([PY, "/venv/bin/torchrun", "--nnodes=2", "t.py"], "torchrun"),
        ([PY, "-m", "torch.distributed.run", "t.py"], "python -m torch.distributed.run"),
        ([PY, "-m", "torch.distributed.launch", "t.py"], "python -m torch.distributed.launch"),
        ([PY, "-u", "-X", "dev", "-m", "torch.distributed.run", "t.py"],
         "python -m torch.distributed.run"),
        ([PY, "-c", "import torch.distributed.run", "-m", "torch.distributed.run"], None),
        ([PY, "/venv/bin/accelerate", "launch", "t.py"], "accelerate launch"),
        ([PY, "/venv/bin/deepspeed", "t.py"], "deepspeed"),
        ([PY, "t.py", "--nnodes=2"], None),
        ([PY, "/venv/bin/accelerate", "config"], None),
        ([PY, "-c", "pass"], None),
    ],
)  # fmt: skip
def test_a_launcher_is_known_by_how_the_interpreter_was_started(argv, name):
    found = inner_launcher.launcher(argv)
    assert (found[0] if found else None) == name


@pytest.mark.parametrize(
    ("words", "master"),
    [
        (["--nnodes=2", "--node_rank=0", "--master_addr=old", "--master_port", "6000", "t.py"],
         "old:6000"),
        (["--rdzv-endpoint", "h:29400", "--master-port=1", "t.py"], "h:29400"),
        (["--main_process_ip", "10.0.0.9", "t.py"], "10.0.0.9"),
        (["--nproc-per-node=2", "t.py", "--master_addr", "x"], None),  # the script's own
        (["--standalone", "t.py"], None),
    ],
)  # fmt: skip
def test_the_master_it_would_wait_for_is_named(words, master):
    assert inner_launcher.waits_for(words) == master


def _started(env: dict[str, str], *command: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": HOOK, "HOME": os.environ.get("HOME", "/")}
    return subprocess.run(
        command, env=base | env, capture_output=True, text=True, timeout=60, check=False
    )


def test_only_inside_a_worker_of_the_entrypoints_launch(tmp_path):
    """A real interpreter with the site hook: stopped inside a worker of a planned launch (no
    torch imported, at once); left alone outside one, or as the node's own launcher."""
    line = ("-m", "torch.distributed.run", "--nnodes=2", "--master_addr=old.invalid", "t.py")
    plan = {"ENTRYPOINT_PLAN_FILE": str(tmp_path / "plan.json")}
    began = time.monotonic()
    inside = _started(plan | {"TORCHELASTIC_RUN_ID": "job"}, PY, *line)
    assert inside.returncode == 2, inside.stderr
    assert time.monotonic() - began < 10
    [said] = inside.stderr.splitlines()
    assert said.startswith(REFUSED) and "wait for old.invalid, not this job's master" in said
    assert "started by `" in said and "entrypoint run -- python -m torch.distributed.run" in said
    # no plan, no worker of a torchrun, or the node's own launcher: torchrun reads its options
    node_pid = {inner_launcher.NODE_PID: str(os.getpid())}
    for env in ({}, plan, plan | {"TORCHELASTIC_RUN_ID": "job"} | node_pid):
        alone = _started(env, PY, "-m", "torch.distributed.run", "--help")
        assert alone.returncode == 0 and "--nproc-per-node" in alone.stdout, (env, alone.stderr)


BASE = {
    "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    "HOME": os.environ.get("HOME", "/tmp"),
    "NNODES": "2",
    "MASTER_ADDR": "127.0.0.1",
    "ENTRYPOINT_GPUS_PER_NODE": "0",
    "ENTRYPOINT_NPROC_PER_NODE": "1",
    "ENTRYPOINT_SOCKET_IFNAME": "lo",
    "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
}
# A wrapper that starts torchrun's agent from Python: no command line names the launcher.
WRAPPER = (
    "from torch.distributed.run import main; "
    "main(['--nnodes=1', '--node_rank=0', '--nproc-per-node=2', 'train.py', '--lr', '1'])"
)
# Seed 002's shape: written for machine 0, run as is on every node, its master long gone.
MACHINE_0 = "torchrun --nnodes=2 --node_rank=0 --master_addr=old-host.invalid train.py --lr 1"


AGENT_LOG = "torch/distributed/elastic/agent/server/api.py:"  # torchrun's agent's log lines
TRAIN = """import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
node = os.environ["GROUP_RANK"]
print(f"trained: rank {dist.get_rank()} of {dist.get_world_size()} on node {node}"
      f", sum {int(t.item())}, port {os.environ['MASTER_PORT']}, args {sys.argv[1:]}", flush=True)
dist.destroy_process_group()
"""


def _two_nodes(tmp_path: Path, scripts: dict[str, str]) -> tuple[list[str], list[int], float, int]:
    """`entrypoint run -- bash <first script>` on 2 loopback nodes: each node's output and exit
    code, the seconds until both ended, and the rendezvous port."""
    for name, text in scripts.items():
        (tmp_path / name).write_text("#!/bin/bash\n" + text.format(dir=tmp_path))
    (tmp_path / "train.py").write_text(TRAIN)
    first = next(iter(scripts))
    port = free_ports(3)
    env = BASE | {"MASTER_PORT": str(port), "ENTRYPOINT_RUN_DIR": str(tmp_path / "run")}
    began = time.monotonic()
    procs = [
        subprocess.Popen(
            [PY, "-m", "entrypoint", "run", "--", "bash", str(tmp_path / first)],
            env=env | {"NODE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]  # 6 to 7 s idle, torch 6 times
    finally:  # a node still running at the timeout is not left behind (its trainers die with it)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outputs, [p.returncode for p in procs], time.monotonic() - began, port


@pytest.mark.parametrize(
    "scripts",
    [
        {"start.sh": f"{MACHINE_0}\necho the script went on\n"},
        {"start.sh": "exec torchrun --nproc-per-node=2 train.py --lr 1\n"},
        {"outer.sh": "bash {dir}/inner.sh\n", "inner.sh": f"{MACHINE_0}\n"},
        {"start.sh": f'exec python -c "{WRAPPER}"\n'},
    ],
    ids=["machine-0-stale-master", "no-node-values", "two-shells-deep", "python-wrapper"],
)
def test_a_start_scripts_own_torchrun_is_adopted_and_trains_as_one_world(tmp_path, scripts):
    """Written for machine 0 (its node rank, an old master), for one machine, or two shells
    deep: each node's torchrun takes the cluster's numbers, and the 2 nodes train as one world
    of 2 (1 worker a node), the script's arguments kept."""
    outputs, codes, took, port = _two_nodes(tmp_path, scripts)
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for node, out in enumerate(outputs):
        found = [x for x in out.splitlines() if "trained: rank" in x]
        assert len(found) == 1, out[-4000:]
        trained = found[0]
        assert f"rank {node} of 2 on node {node}, sum 2, port {port - 1}" in trained, out[-3000:]
        assert "args ['--lr', '1']" in trained, trained
        found = [x for x in out.splitlines() if "entrypoint: adopted" in x]
        assert len(found) == 1, out[-4000:]
        said = found[0]
        assert (
            f"2 nodes x 1 process, node rank {node}, rendezvous static at 127.0.0.1:{port - 1}"
            in said
        ), said
        if "WRAPPER" in str(scripts) or "from torch.distributed.run" in str(scripts):
            assert "torchrun's agent started from Python" in said, said
            assert "nnodes 1 -> 2, nproc_per_node 2 -> 1" in said, said
        if "old-host" in str(scripts) and node == 1:
            assert "--node_rank=0 -> 1" in said, said
            assert "--master_addr=old-host.invalid -> 127.0.0.1" in said, said
        if len(scripts) > 1:  # the shell that ran it, inside the command
            assert f"`bash {tmp_path / 'inner.sh'}`'s torchrun" in said, said
    # torchrun's own agent may log its exit barrier's lost store (node 0's agent, which holds
    # it, ended first: torchrun's race, the job's exit 0 all the same); nothing else may fail
    ours = [x for out in outputs for x in out.splitlines() if AGENT_LOG not in x]
    assert not [x for x in ours if "Traceback" in x], outputs[0][-3000:] + outputs[1][-3000:]
    print(f"MEASURED a start script's torchrun adopted, 2 loopback nodes: {took:.1f} s")


def test_a_start_scripts_deepspeed_is_run_by_torchrun_and_trains_as_one_world(tmp_path):
    """`deepspeed --num_gpus 8 --hostfile ... train.py` in a start script: torchrun runs the
    script in its place on the cluster's numbers (DeepSpeed's launcher is never imported: the
    hook takes the process first), the script given `--local_rank=N` as DeepSpeed gives it."""
    line = ("python -m deepspeed.launcher.runner --num_gpus 8 --hostfile /etc/nohosts "
            "--master_addr old-host.invalid train.py --lr 1")  # fmt: skip
    outputs, codes, took, port = _two_nodes(tmp_path, {"start.sh": f"{line}\n"})
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for node, out in enumerate(outputs):
        found = [x for x in out.splitlines() if "trained: rank" in x]
        assert len(found) == 1, out[-4000:]
        assert f"rank {node} of 2 on node {node}, sum 2, port {port - 1}" in found[0], found
        assert "args ['--lr', '1', '--local_rank=0']" in found[0], found
        [said] = [x for x in out.splitlines() if "entrypoint: adopted" in x]
        assert "python -m deepspeed.launcher.runner: --num_gpus=8 -> 1" in said, said
        assert "--hostfile=/etc/nohosts -> (dropped)" in said, said
        assert "--master_addr=old-host.invalid -> 127.0.0.1" in said, said
        assert "run by torchrun with --local_rank=N as deepspeed gives it" in said, said
    ours = [x for out in outputs for x in out.splitlines() if AGENT_LOG not in x]
    assert not [x for x in ours if "Traceback" in x], outputs[0][-3000:] + outputs[1][-3000:]
    print(f"MEASURED a start script's deepspeed adopted, 2 loopback nodes: {took:.1f} s")


def test_a_start_scripts_launcher_that_cannot_be_adopted_stops_every_node_at_once(tmp_path):
    """accelerate's config file unreadable on the node: one line, exit 2, at once, the line
    last (accelerate itself is never imported: the hook reads the file first)."""
    line = "python -m accelerate.commands.launch --config_file /etc/none.yaml t.py"
    outputs, codes, took, _ = _two_nodes(tmp_path, {"start.sh": f"{line}\n"})  # stopped first
    assert codes == [2, 2], outputs[0][-3000:]
    assert took < 60, took  # the bound the issue sets, on a loaded machine
    stop = [line for line in outputs[0].splitlines() if "stopping every node (exit 2)" in line]
    assert stop and REFUSED in stop[0], outputs[0][-3000:]
    assert f"started by `bash {tmp_path / 'start.sh'}`" in stop[0], stop
    assert "--config_file=/etc/none.yaml cannot be read on this node" in stop[0], stop
    assert "Traceback" not in "".join(outputs) and "ChildFailedError" not in "".join(outputs)


@pytest.mark.parametrize(
    ("words", "env", "expected", "changes"),
    [
        (["--nnodes=2", "--node_rank=0", "--master_addr", "old", "--max-restarts=3", "t.py", "-x"],
         {"GROUP_RANK": "1"},
         ["--max-restarts=3", "t.py", "-x"],
         ["--node_rank=0 -> 1", "--master_addr=old -> w0"]),
        (["--standalone", "--nproc_per_node", "8", "-m", "pkg.train"], {},
         ["-m", "pkg.train"],
         ["--standalone -> (dropped)", "--nproc_per_node=8 -> 2"]),
        (["--use-env", "--nproc_per_node=2", "t.py", "--nnodes", "9"], {},
         ["--use-env", "t.py", "--nnodes", "9"], []),  # the script's own options are its own
    ],
)  # fmt: skip
def test_the_cluster_numbers_replace_those_written(words, env, expected, changes):
    worker = {"GROUP_WORLD_SIZE": "2", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "2",
              "MASTER_ADDR": "w0", "MASTER_PORT": "29500"} | env  # fmt: skip
    found = inner_launcher.adopt("python -m torch.distributed.launch", words, worker)
    assert found is not None
    new, said = found.words, found.changes
    rank = worker["GROUP_RANK"]
    assert new == ["--nnodes=2", f"--node-rank={rank}", "--nproc-per-node=2", "--master-addr=w0",
                   "--master-port=29499", "--rdzv-backend=static", "--rdzv-endpoint=w0:29499",
                   *expected]  # fmt: skip
    assert said == changes
    assert inner_launcher.adopt("deepspeed", words, worker) is None
    assert inner_launcher.adopt("torchrun", words, {}) is None


WORKER = {"GROUP_WORLD_SIZE": "2", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2",
          "MASTER_ADDR": "w0", "MASTER_PORT": "29500"}  # fmt: skip
HEAD = ["--nnodes=2", "--node-rank=1", "--nproc-per-node=2", "--master-addr=w0",
        "--master-port=29499", "--rdzv-backend=static", "--rdzv-endpoint=w0:29499"]  # fmt: skip


@pytest.mark.parametrize(
    ("words", "run", "changes"),
    [
        (["--num_gpus=8", "-H", "hosts", "t.py", "--deepspeed"],
         ["--module", "entrypoint.trainer_side.local_rank_arg", "python", "t.py", "--deepspeed"],
         ["--num_gpus=8 -> 2", "-H=hosts -> (dropped)"]),
        (["--num_nodes", "2", "--no_local_rank", "--module", "pkg.train"],
         ["--no-python", "python", "-m", "pkg.train"], []),
        (["--no_python", "--master_port=6000", "./run.sh", "-x"],
         ["--module", "entrypoint.trainer_side.local_rank_arg", "./run.sh", "-x"],
         ["--master_port=6000 -> 29499"]),
    ],
)  # fmt: skip
def test_a_deepspeed_line_becomes_torchruns_on_the_cluster_numbers(words, run, changes):
    found = inner_launcher.deepspeed(words, WORKER)
    assert found is not None
    assert found.program == "torch.distributed.run"
    assert found.words == HEAD + run and found.changes == changes
    assert inner_launcher.deepspeed(["--num_gpus=2"], WORKER) is None  # no script
    assert inner_launcher.deepspeed(words, {}) is None


MULTI_CPU = """distributed_type: MULTI_CPU
num_machines: 2
num_processes: 4
machine_rank: 0
main_process_ip: 10.20.30.40
main_process_port: 29500
mixed_precision: 'no'
"""


def test_an_accelerate_line_names_a_file_with_the_cluster_numbers(tmp_path):
    """A MULTI_CPU config on CPU nodes: accelerate's multi-process launcher, the whole job's
    process count, this node's rank and the job's master; the line's own options kept."""
    import json

    env = WORKER | {"ENTRYPOINT_PLAN_FILE": str(tmp_path / "plan.json"), "DS_ACCELERATOR": "cpu"}
    words = ["--config_file", "cfg.yaml", "--num_processes=8", "--mixed_precision", "no",
             "t.py", "--num_processes", "3"]  # fmt: skip
    found = inner_launcher.accelerate(words, env, {"cfg.yaml": MULTI_CPU}.get)
    assert found is not None
    path = str(tmp_path / "accelerate-inner-1.yaml")
    assert found.words == ["--config_file", path, "--mixed_precision", "no", "t.py",
                           "--num_processes", "3"]  # fmt: skip
    body = json.loads(found.files[path].split("\n", 1)[1])
    assert body["distributed_type"] == "MULTI_GPU" and body["use_cpu"] is True
    assert (body["num_machines"], body["machine_rank"], body["num_processes"]) == (2, 1, 4)
    assert (body["main_process_ip"], body["main_process_port"]) == ("w0", 29499)
    assert "--num_processes=8 -> 4" in found.changes
    assert "main_process_ip: 10.20.30.40 in cfg.yaml -> w0" in found.changes
    assert "machine_rank: 0 in cfg.yaml -> 1" in found.changes
    assert "one process per machine" in found.note
    # the same file on GPU nodes: refused, naming the setting
    with pytest.raises(inner_launcher.accelerate_config.CannotRun, match="distributed_type"):
        inner_launcher.accelerate(
            words, WORKER | {"ENTRYPOINT_PLAN_FILE": "p"}, {"cfg.yaml": MULTI_CPU}.get
        )
