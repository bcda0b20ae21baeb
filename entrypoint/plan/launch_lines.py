"""A user's own launch line, adopted: `torchrun ...` or `python -m torch.distributed.run ...`
after `entrypoint run --`. The entrypoint becomes that launcher's caller instead of wrapping it
(a torchrun inside torchrun knows nothing of the other nodes: every node would train alone).
It keeps what is the user's to choose, the script, its arguments, how it is run (`-m`,
`--no-python`) and `--nproc-per-node`, and supplies what only the platform knows (node count,
node rank, master, rendezvous) in place of what the line hard-coded; the rest of torchrun's
options are the entrypoint's own torchrun's. Pure: a command in, an `Adopted` or None out."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from entrypoint.plan.errors import ConfigError

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
# What only the platform knows: the entrypoint's values replace the line's.
PLATFORM = ("nnodes", "node-rank", "master-addr", "master-port", "rdzv-endpoint", "rdzv-backend",
            "rdzv-id", "rdzv-conf", "standalone", "local-addr")  # fmt: skip


@dataclass(frozen=True)
class Adopted:
    """The user's launch line, read: the trainer as `entrypoint run` takes it, the workers per
    node the line asks for, and what it said that the entrypoint decides instead."""

    line: str  # `torchrun` or `python -m torch.distributed.run`
    trainer: tuple[str, ...]
    nproc_per_node: int | None = None
    nnodes: str | None = None  # as written: `2`, or a range `1:4`
    replaced: dict[str, str] = field(default_factory=dict)  # option: the line's value


def is_torchrun(command: Sequence[str]) -> int:
    """How many words of `command` name torchrun (`torchrun`: 1, `python -m
    torch.distributed.run`: 3), or 0."""
    if not command:
        return 0
    head = os.path.basename(command[0])
    if head == "torchrun":
        return 1
    if head.startswith("python") and list(command[1:3]) == ["-m", "torch.distributed.run"]:
        return 3
    return 0


def read(command: Sequence[str] | None) -> Adopted | None:
    """The launch line in `command`, or None when the command is no launcher's."""
    skip = is_torchrun(command or ())
    if not skip:
        return None
    assert command is not None
    line = "torchrun" if skip == 1 else "python -m torch.distributed.run"
    given: dict[str, str] = {}
    words = list(command[skip:])
    while words and words[0].startswith("-"):
        word = words.pop(0)
        name, sep, value = word.partition("=")
        name = SHORT.get(name) or name.lstrip("-").replace("_", "-")
        if name in FLAGS and not sep:
            given[name] = ""
        elif name in VALUED:
            if not sep:
                if not words:
                    raise ConfigError(
                        word, None, f"in your {line} line takes a value", "Give it one"
                    )
                value = words.pop(0)
            given[name] = value
        else:
            raise ConfigError(
                "launch line",
                word,
                f"is not an option {line} knows",
                f"Check the spelling in your launch line (`{line} --help`)",
            )
    if not words:
        raise ConfigError("command", " ".join(command), f"your {line} line names no script",
                          "Give the training script after the options")  # fmt: skip
    script, args = words[0], words[1:]
    if "no-python" in given:
        trainer = (script, *args)
    elif "module" in given:
        trainer = ("python", "-m", script, *args)
    else:
        trainer = ("python", script, *args)
    nproc = given.get("nproc-per-node")
    return Adopted(
        line=line,
        trainer=trainer,
        nproc_per_node=int(nproc) if nproc and nproc.isdigit() else None,
        nnodes=given.get("nnodes"),
        replaced={k: given[k] for k in PLATFORM if k in given}
        | {k: v for k, v in given.items() if k not in PLATFORM and k not in KEPT},
    )


# The line's own, kept: how the script runs and the workers per node (the others are the
# entrypoint's torchrun's: logs, restarts, signals, its monitoring).
KEPT = frozenset({"nproc-per-node", "module", "no-python", "run-path"})


def check_nodes(adopted: Adopted, nnodes: int, source: str) -> str | None:
    """`--nnodes` against the platform's node count: None when absent or equal, a note when a
    range holds it; a refusal when it disagrees."""
    written = adopted.nnodes
    if written is None:
        return None
    low, sep, high = written.partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise ConfigError(
            "--nnodes", written, f"in your {adopted.line} line is not a node count",
            "Drop --nnodes: the entrypoint supplies the platform's",
        ) from None  # fmt: skip
    if lo <= nnodes <= hi:
        return None if not sep else f"--nnodes {written} in your launch line holds {nnodes}"
    raise ConfigError(
        "--nnodes",
        written,
        f"in your {adopted.line} line, but the platform runs {nnodes} nodes ({source})",
        "Drop --nnodes from the launch line (the entrypoint supplies the platform's count), or "
        "start the job on that many nodes",
    )
