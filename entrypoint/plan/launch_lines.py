"""A user's own launch line, adopted: `torchrun ...`, `python -m torch.distributed.run ...`,
`python -m torch.distributed.launch [--use-env] ...` (the older launcher: torchrun's options,
and the script's local rank as `--local-rank=N` unless `--use-env`), `deepspeed ...` or
`accelerate launch [--config_file cfg.yaml] ...` after `entrypoint run --`. The entrypoint
becomes that launcher's caller instead of wrapping it (a torchrun inside torchrun knows nothing
of the other nodes: every node would train alone).
It keeps what is the user's to choose, the script, its arguments, how it is run (`-m`,
`--no-python`) and `--nproc-per-node`, and supplies what only the platform knows (node count,
node rank, master, rendezvous) in place of what the line hard-coded; the rest of torchrun's
options are the entrypoint's own torchrun's. An accelerate line keeps its config file's
settings and its options (mixed precision, DeepSpeed, FSDP), with the cluster's numbers in
place of `num_machines`, `machine_rank`, `main_process_ip` and the port. Pure: a command (and
the text of the config file it names, read at the edge) in, an `Adopted` or None out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from entrypoint.plan.errors import ConfigError
from entrypoint.trainer_side import accelerate_config
from entrypoint.trainer_side.launcher_names import (
    ACCELERATE_FLAGS,
    ACCELERATE_PLATFORM,
    ACCELERATE_SHORT,
    DEEPSPEED_FLAGS,
    DEEPSPEED_SHORT,
    FLAGS,
    LAUNCH_FLAGS,
    SHORT,
    VALUED,
    is_accelerate,
    is_deepspeed,
    is_launch,
    is_torchrun,
)

# The launchers' options (their names, flags and short forms) are in
# trainer_side/launcher_names.py, which the trainer's processes read too.

# torchrun's: what only the platform knows, the entrypoint's values in place of the line's.
PLATFORM = ("nnodes", "node-rank", "master-addr", "master-port", "rdzv-endpoint", "rdzv-backend",
            "rdzv-id", "rdzv-conf", "standalone", "local-addr")  # fmt: skip


# How the trainer gets `--local_rank=N` after its arguments, as DeepSpeed's launcher gives it,
# and `--local-rank=N` before them, as `torch.distributed.launch` gives it without --use-env.
LOCAL_RANK_ARG = ("python", "-m", "entrypoint.trainer_side.local_rank_arg")
LOCAL_RANK_FIRST = (*LOCAL_RANK_ARG, "--first")


@dataclass(frozen=True)
class Adopted:
    """The user's launch line, read: the trainer as `entrypoint run` takes it, the workers per
    node the line asks for, and what it said that the entrypoint decides instead."""

    line: str  # `torchrun`, `python -m torch.distributed.run`, ..., `accelerate launch`
    trainer: tuple[str, ...]
    nproc_per_node: int | None = None
    nnodes: str | None = None  # as written: `2`, or a range `1:4`
    replaced: dict[str, str] = field(default_factory=dict)  # option: the line's value
    kind: str = "torchrun"  # or "accelerate"
    # accelerate: its config file (as the line names it) and what it holds, the options kept
    # as written, the job's process count (accelerate counts every node's), and where the node
    # count and the process count were written
    config_file: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    options: tuple[str, ...] = ()
    num_processes: int | None = None
    nnodes_name: str = "--nnodes"
    nproc_name: str = "--nproc-per-node"


def config_file(command: Sequence[str] | None) -> str | None:
    """The config file an accelerate launch line names (`--config_file`), for the edge to read."""
    skip = is_accelerate(command or ())
    if not skip:
        return None
    assert command is not None
    words = list(command[skip:])
    for i, word in enumerate(words):
        name, sep, value = word.partition("=")
        if name in ("--config_file", "--config-file"):
            return value if sep else (words[i + 1] if i + 1 < len(words) else None)
        if not word.startswith("-"):
            return None  # the script: what follows is its own
    return None


def read(
    command: Sequence[str] | None, config_text: str | None = None, nnodes: int = 1
) -> Adopted | None:
    """The launch line in `command`, or None when the command is no launcher's. An accelerate
    line's config file is given as `config_text` (None: unreadable or not named), and the
    platform's node count as `nnodes` (accelerate's process count is every node's)."""
    if is_accelerate(command or ()):
        assert command is not None
        return _accelerate(command, config_text, nnodes)
    if is_deepspeed(command or ()):
        assert command is not None
        return _deepspeed(command)
    skip, flags = is_launch(command or ()), LAUNCH_FLAGS
    if skip:
        line = "python -m torch.distributed.launch"
    else:
        skip, flags = is_torchrun(command or ()), FLAGS
        line = "torchrun" if skip == 1 else "python -m torch.distributed.run"
    if not skip:
        return None
    assert command is not None
    words = list(command[skip:])
    given = {name: value for name, value, _ in _options(words, line, flags, SHORT, VALUED)}
    trainer = _script(words, given, command, line)
    if flags is LAUNCH_FLAGS and "use-env" not in given:
        trainer = (*LOCAL_RANK_FIRST, *trainer)
    nproc = given.get("nproc-per-node")
    return Adopted(
        line=line,
        trainer=trainer,
        nproc_per_node=int(nproc) if nproc and nproc.isdigit() else None,
        nnodes=given.get("nnodes"),
        replaced={k: given[k] for k in PLATFORM if k in given}
        | {k: v for k, v in given.items() if k not in PLATFORM and k not in KEPT},
    )


def _options(
    words: list[str],
    line: str,
    flags: frozenset[str],
    short: dict[str, str],
    valued: frozenset[str] | None = None,
) -> list[tuple[str, str, list[str]]]:
    """The options before the script, taken off `words`: (name, value or "" for a flag, the
    words as written) each, names spelled with dashes. With `valued`, an option in neither
    list is refused (torchrun's); without, every option not a flag takes a value."""
    out = []
    while words and words[0].startswith("-"):
        word = words.pop(0)
        name, sep, value = word.partition("=")
        name = short.get(name) or name.lstrip("-").replace("_", "-")
        if name in flags and not sep:
            out.append((name, "", [word]))
        elif valued is not None and name not in valued:
            raise ConfigError(
                "launch line",
                word,
                f"is not an option {line} knows",
                f"Check the spelling in your launch line (`{line} --help`)",
            )
        elif sep:
            out.append((name, value, [word]))
        elif words:
            out.append((name, words[0], [word, words.pop(0)]))
        else:
            raise ConfigError(word, None, f"in your {line} line takes a value", "Give it one")
    return out


def _script(
    words: list[str], given: Mapping[str, str], command: Sequence[str], line: str
) -> tuple[str, ...]:
    """The trainer as `entrypoint run` takes it: the script and its arguments, run as the line
    runs it (`--module`, `--no-python`)."""
    if not words:
        raise ConfigError(
            "command",
            " ".join(command),
            f"your {line} line names no script",
            "Give the training script after the options",
        )
    script, args = words[0], words[1:]
    if "no-python" in given:
        return (script, *args)
    if "module" in given:
        return ("python", "-m", script, *args)
    return ("python", script, *args)


# The line's own, kept: how the script runs and the workers per node (the others are the
# entrypoint's torchrun's: logs, restarts, signals, its monitoring).
KEPT = frozenset({"nproc-per-node", "module", "no-python", "run-path", "use-env"})


def check_nodes(adopted: Adopted, nnodes: int, source: str) -> str | None:
    """The line's node count (`--nnodes`, accelerate's `num_machines`) against the platform's:
    None when absent or equal, a note when a range holds it; a refusal when it disagrees."""
    written, name = adopted.nnodes, adopted.nnodes_name
    if written is None:
        return None
    low, sep, high = written.partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise ConfigError(
            name,
            written,
            f"in your {adopted.line} line is not a node count",
            f"Drop {name}: the entrypoint supplies the platform's",
        ) from None
    if lo <= nnodes <= hi:
        if sep:
            return f"{name} {written} in your launch line holds {nnodes}"
        if adopted.kind == "accelerate":
            return f"{name}: {written} agrees with the platform's; the entrypoint's value is used"
        return None
    said = f"in your {adopted.line} line, but" if name.startswith("-") else "but"
    raise ConfigError(
        name,
        written,
        f"{said} the platform runs {nnodes} nodes ({source})",
        f"Drop {name} (the entrypoint supplies the platform's count), or start the job on that "
        "many nodes",
    )


def _accelerate(command: Sequence[str], config_text: str | None, nnodes: int) -> Adopted:
    line = "accelerate launch"
    words = list(command[is_accelerate(command) :])
    options = _options(words, line, ACCELERATE_FLAGS, ACCELERATE_SHORT)
    given = {name: value for name, value, _ in options}
    # the platform's, the config file and the process count are the entrypoint's to write
    own = {*ACCELERATE_PLATFORM, "config-file", "num-processes", "module", "no-python"}
    kept = [w for name, _, written in options if name not in own for w in written]
    trainer = _script(words, given, command, line)
    path = given.get("config-file")
    try:
        config = accelerate_config.read(path, config_text, f"in your {line} line ") if path else {}
    except accelerate_config.CannotRun as cannot:
        raise ConfigError(*cannot.args) from None
    where = path or ""
    # The line's options win over the file's, as accelerate has it.
    machines = given.get("num-machines", config.get("num_machines"))
    processes = given.get("num-processes", config.get("num_processes"))
    machines_at = "--num_machines" if "num-machines" in given else f"num_machines in {where}"
    procs_at = "--num_processes" if "num-processes" in given else f"num_processes in {where}"
    count = _count(processes, procs_at, line)
    per_node = None
    # A node count that disagrees is refused by check_nodes, naming it: no per-node figure.
    if count is not None and (machines is None or _count(machines, machines_at, line) == nnodes):
        if count % nnodes:
            raise ConfigError(
                procs_at,
                count,
                f"{count} processes on {nnodes} nodes is no whole number per node (accelerate "
                "counts the processes of every node)",
                "Set it to nodes x processes per node, or drop it: the entrypoint sets it",
            )
        per_node = count // nnodes
    replaced = {k: given[k] for k in ACCELERATE_PLATFORM if k in given}
    for key in (
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "rdzv_backend",
        "same_network",
        "deepspeed_hostfile",
        "mpirun_hostfile",
    ):
        if key in config and key.replace("_", "-") not in replaced:
            replaced[f"{key} in {path}"] = str(config[key])
    return Adopted(
        line=line,
        trainer=trainer,
        nproc_per_node=per_node,
        nnodes=None if machines is None else str(machines),
        replaced=replaced,
        kind="accelerate",
        config_file=path,
        config=config,
        options=tuple(kept),
        num_processes=count,
        nnodes_name=machines_at,
        nproc_name=procs_at,
    )


def _count(value: object, where: str, line: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not str(value).strip().isdigit() or int(str(value)) < 1:
        raise ConfigError(
            where, value, f"in your {line} line is not a count", "Give a whole number"
        )
    return int(str(value))


def _deepspeed(command: Sequence[str]) -> Adopted:
    """`deepspeed [--num_gpus N] [--num_nodes N] ... train.py ARGS`: run by the entrypoint's
    torchrun, the script given `--local_rank=N` as DeepSpeed's launcher gives it (unless
    `--no_local_rank`)."""
    line = "deepspeed"
    words = list(command[is_deepspeed(command) :])
    given = {n: v for n, v, _ in _options(words, line, DEEPSPEED_FLAGS, DEEPSPEED_SHORT)}
    trainer = _script(words, given, command, line)
    if "no-local-rank" not in given:
        trainer = (*LOCAL_RANK_ARG, *trainer)
    nproc = given.get("num-gpus", given.get("num-accelerators"))
    if nproc is not None and not nproc.isdigit():
        raise ConfigError(
            "--num_gpus",
            nproc,
            f"in your {line} line is not a count",
            "Give a whole number, or drop it: one worker per GPU",
        )
    own = {"module", "no-python", "no-local-rank", "num-gpus", "num-accelerators", "quiet"}
    return Adopted(
        line=line,
        trainer=trainer,
        nproc_per_node=int(nproc) if nproc else None,
        nnodes=given.get("num-nodes"),
        replaced={k.replace("-", "_"): v for k, v in given.items() if k not in own},
        kind="deepspeed",
        nnodes_name="--num_nodes",
        nproc_name="--num_gpus",
    )
