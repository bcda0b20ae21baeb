"""How a command names a launcher: `torchrun ...` or `python -m torch.distributed.run ...`, and
the others the entrypoint knows. Read by the plan (plan/launch_lines.py: a launch line given to
the entrypoint is adopted) and in the trainer's processes (inner_launcher.py: one started inside
the command is stopped)."""

from __future__ import annotations

import os
from collections.abc import Sequence

# The interpreter's options that take a value (`python -X dev -W error -m ...`).
VALUED = frozenset({"-X", "-W"})


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
        i += 2 if command[i] in VALUED else 1
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
