"""The launch lines users write, each as its docs or seeds write it, for the trainers in this
directory mounted at /workspace: the compat matrix runs each (tests/compat/test_compat.py), and
benchmarks/launch_forms.py times each to its first step. Not a trainer: nothing here runs in a
container."""

from __future__ import annotations

WORKSPACE = "/workspace"
W = WORKSPACE

LAUNCH_LINES = {
    "torchrun": ("torchrun", "--nproc-per-node=2", f"{W}/ddp_tutorial.py"),
    "python -m torch.distributed.run": (
        "python", "-m", "torch.distributed.run", "--nproc_per_node", "2", f"{W}/ddp_tutorial.py",
    ),
    # the older launcher, as tutorials still write it
    "python -m torch.distributed.launch": (
        "python", "-m", "torch.distributed.launch", "--nproc_per_node=2", "--use-env",
        f"{W}/ddp_tutorial.py",
    ),
    # DeepSpeed's getting-started line, run per node: its script reads --local_rank
    "deepspeed": (
        "deepspeed", "--num_gpus", "2", f"{W}/deepspeed_tutorial.py", "--deepspeed",
        "--deepspeed_config", f"{W}/ds_config_tutorial.json",
    ),
    # seed 004's line: a config file written for machine 0, its main_process_ip not this cluster's
    "accelerate launch": (
        "accelerate", "launch", "--config_file", f"{W}/accelerate_machine0.yaml",
        f"{W}/accelerate_quicktour.py",
    ),
    # the CPU form of the same file (MULTI_CPU, 4 processes): accelerate alone would start one
    # process per machine
    "accelerate launch multi-cpu": (
        "accelerate", "launch", "--config_file", f"{W}/accelerate_multi_cpu.yaml",
        f"{W}/accelerate_quicktour.py",
    ),
}  # fmt: skip

# Start scripts, each started as `bash <script>`: written for one machine (start.sh), or for
# machine 0 of an old cluster and started from a wrapper, two shells deep (outer.sh ->
# start_machine0.sh); accelerate with seed 004's file in its CPU form (start_accelerate.sh);
# DeepSpeed's launcher with a hostfile (start_deepspeed.sh).
SCRIPTS = ("start.sh", "outer.sh", "start_accelerate.sh", "start_deepspeed.sh")
