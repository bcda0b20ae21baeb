"""How a command names a launcher: `torchrun ...` or `python -m torch.distributed.run ...`, and
the others the entrypoint knows. Read by the plan (plan/launch_lines.py: a launch line given to
the entrypoint is adopted) and in the trainer's processes (inner_launcher.py: one started inside
the command is stopped)."""

from __future__ import annotations

import os
from collections.abc import Sequence


def _named(command: Sequence[str], program: tuple[str, ...], module: str) -> int:
    """How many words of `command` name a launcher: its `program` (with a subcommand, as
    `accelerate launch`), or `python -m <module>` (3); 0 when it names another."""
    if not command:
        return 0
    head = os.path.basename(command[0])
    if program and head == program[0] and tuple(command[1 : len(program)]) == program[1:]:
        return len(program)
    if head.startswith("python") and list(command[1:3]) == ["-m", module]:
        return 3
    return 0


def is_torchrun(command: Sequence[str]) -> int:
    return _named(command, ("torchrun",), "torch.distributed.run")


def is_launch(command: Sequence[str]) -> int:
    """`python -m torch.distributed.launch` (it has no command of its own)."""
    return _named(command, (), "torch.distributed.launch")


def is_accelerate(command: Sequence[str]) -> int:
    return _named(command, ("accelerate", "launch"), "accelerate.commands.launch")


def is_deepspeed(command: Sequence[str]) -> int:
    return _named(command, ("deepspeed",), "deepspeed.launcher.runner")
