"""How a command names a launcher (`torchrun ...`, `python -m torch.distributed.run ...` and
the others the entrypoint knows), and their options. Read by the plan (plan/launch_lines.py: a
launch line given to the entrypoint is adopted) and in the trainer's processes
(inner_launcher.py: one started inside the command is stopped)."""

from __future__ import annotations

import os
from collections.abc import Sequence

# torchrun's options (torch/distributed/run.py, get_args_parser; tests/unit/test_launch_lines.py
# checks this list against torch's own): those that take a value, and the flags.
VALUED = frozenset(
    {
        "nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
        "max-restarts", "monitor-interval", "start-method", "event-log-handler", "role",
        "log-dir", "redirects", "tee", "local-ranks-filter", "duplicate-stdout-filters",
        "duplicate-stderr-filters", "node-rank", "master-addr", "master-port", "local-addr",
        "logs-specs", "numa-binding", "signals-to-handle", "shutdown-timeout",
    }
)  # fmt: skip
FLAGS = frozenset({"standalone", "module", "no-python", "run-path", "virtual-local-rank"})
SHORT = {"-m": "module", "-r": "redirects", "-t": "tee"}
# torch.distributed.launch's one option of its own (torch/distributed/launch.py, parse_args).
LAUNCH_FLAGS = FLAGS | {"use-env"}


# accelerate launch's options without a value (accelerate 1.15, commands/launch.py; the image
# test tests/image/test_users_code.py checks this list against accelerate's own parser): every
# other option takes one.
ACCELERATE_FLAGS = frozenset(
    {
        "quiet", "cpu", "multi-gpu", "tpu", "enable-cpu-affinity", "dynamo-use-fullgraph",
        "dynamo-use-dynamic", "dynamo-use-regional-compilation", "use-deepspeed", "use-fsdp",
        "use-parallelism-config", "use-megatron-lm", "same-network", "module", "no-python",
        "tpu-cluster", "no-tpu-cluster", "tpu-use-sudo", "downcast-bf16",
        "fp8-use-autocast-during-eval", "debug",
    }
)  # fmt: skip
ACCELERATE_SHORT = {"-q": "quiet", "-m": "module", "-t": "tee"}
# Its options that name the platform (the node count, the node's rank, the main process, the
# rendezvous, the hosts): the entrypoint writes these; the process count, accelerate's for the
# whole job, with them.
ACCELERATE_PLATFORM = ("num-machines", "machine-rank", "main-process-ip", "main-process-port",
                       "rdzv-backend", "rdzv-conf", "same-network", "deepspeed-hostfile",
                       "mpirun-hostfile")  # fmt: skip


# DeepSpeed's launcher (`deepspeed`, deepspeed/launcher/runner.py, 0.19): its flags, checked
# against its parser in the image (tests/image/test_users_code.py); every other option takes a
# value.
DEEPSPEED_FLAGS = frozenset({"module", "no-python", "no-local-rank", "no-ssh", "no-ssh-check",
                             "force-multi", "save-pid", "bind-cores-to-rank", "quiet"})  # fmt: skip
DEEPSPEED_SHORT = {"-H": "hostfile", "-i": "include", "-e": "exclude", "-q": "quiet"}
# Its options that torchrun, run in its place, takes under its own names; the others that place
# the job (hostfile, include, launcher, ...) are dropped, as the platform starts the nodes.
DEEPSPEED_AS_TORCHRUN = {"num-gpus": "nproc-per-node", "num-accelerators": "nproc-per-node",
                         "num-nodes": "nnodes", "master-addr": "master-addr",
                         "master-port": "master-port", "node-rank": "node-rank"}  # fmt: skip
# How it runs the script, kept: as a module, as a program, without `--local_rank=N`.
DEEPSPEED_KEPT = frozenset({"module", "no-python", "no-local-rank", "quiet"})


# The interpreter's options that take a value (`python -X dev -W error -m ...`).
PYTHON_VALUED = frozenset({"-X", "-W"})


def _named(command: Sequence[str], program: tuple[str, ...], module: str) -> int:
    """How many words of `command` name a launcher: its `program` (with a subcommand, as
    `accelerate launch`), or `python [options] -m <module>` (3, and one more for each of the
    interpreter's options, as `python -u -m torch.distributed.run`); 0 when it names another."""
    if not command:
        return 0
    head = os.path.basename(command[0])
    if program and head == program[0] and tuple(command[1 : len(program)]) == program[1:]:
        return len(program)
    if not head.startswith("python"):
        return 0
    i = 1
    while i < len(command) and command[i].startswith("-") and command[i] != "-m":
        if command[i] == "-c" or command[i] == "-":
            return 0  # code, not a module
        i += 2 if command[i] in PYTHON_VALUED else 1
    return i + 2 if list(command[i : i + 2]) == ["-m", module] else 0


def is_torchrun(command: Sequence[str]) -> int:
    return _named(command, ("torchrun",), "torch.distributed.run")


def is_launch(command: Sequence[str]) -> int:
    """`python -m torch.distributed.launch` (it has no command of its own)."""
    return _named(command, (), "torch.distributed.launch")


def is_accelerate(command: Sequence[str]) -> int:
    return _named(command, ("accelerate", "launch"), "accelerate.commands.launch")


def is_deepspeed(command: Sequence[str]) -> int:
    return _named(command, ("deepspeed",), "deepspeed.launcher.runner")
