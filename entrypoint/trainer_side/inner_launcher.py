"""A launcher started inside a worker of the entrypoint's launch is adopted where it runs, or
stops at once in one line.

`entrypoint run -- bash start.sh` whose script runs `torchrun ...` (or `python -m
torch.distributed.run`, `python -m torch.distributed.launch`, at any depth of shells): the
entrypoint's torchrun runs the script as its worker, one copy per worker, and the launcher inside
knows nothing of the other nodes. It would start a job of its own on this node, or wait for a
master that is not this job's (a script written for machine 0, `--master_addr` an old address:
it waited for minutes, with no line at all). So the site hook takes it before it reads its
options (`adopt`): in the copy of local rank 0, the cluster's numbers replace those written
there (node count, node rank, processes per node, master address, and a port of its own: the
rendezvous port - 1, as the entrypoint's torchrun holds the rendezvous port), the user's other
options are kept, and one line names what was replaced; the node's other copies leave the
launcher at once (exit 0), so that it runs once a node. `accelerate launch` and `deepspeed`
inside a command are not adopted: they stop in one line naming the launcher, the script that
started it and the master it would wait for, and exit 2 (a configuration error: every node
stops, and a restart would not help). A launch line the entrypoint is given itself (`entrypoint
run -- torchrun ...`) is adopted by the plan (plan/launch_lines.py).

Told apart from the entrypoint's own launcher and what it starts (accelerate's own
subprocesses): torchrun gives its workers TORCHELASTIC_RUN_ID, and the entrypoint's launcher is
its node's child (ENTRYPOINT_NODE_PID)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence

from entrypoint import EXIT_CONFIG
from entrypoint.trainer_side import launcher_names as names
from entrypoint.trainer_side.world_check import PLAN_VARIABLE

REFUSED = "entrypoint: a launcher inside the command"  # how the node's entrypoint knows the line
WORKER_OF_TORCHRUN = "TORCHELASTIC_RUN_ID"
NODE_PID = "ENTRYPOINT_NODE_PID"  # set by the node for its launcher (supervise/launcher_process)
# The options that name where the launcher's rendezvous waits (torchrun's, accelerate's,
# DeepSpeed's), spelled with dashes.
ADDRESS = ("rdzv-endpoint", "master-addr", "main-process-ip")
PORT = ("master-port", "main-process-port")
# Every known launcher's options that take no value, and their short forms.
FLAGS = names.LAUNCH_FLAGS | names.ACCELERATE_FLAGS | names.DEEPSPEED_FLAGS
SHORT = names.SHORT | names.ACCELERATE_SHORT | names.DEEPSPEED_SHORT


def launcher(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """(its name, its words) when this process is a launcher: `python -m torch.distributed.run`
    and the like as the interpreter was started (sys.orig_argv), or a launcher's command
    (`torchrun`, `accelerate launch`, `deepspeed`: the interpreter, then the command's path)."""
    words = list(argv)
    for command in (words, words[1:]):
        for is_it, name in (
            (names.is_launch, "python -m torch.distributed.launch"),
            (names.is_torchrun, "torchrun"),
            (names.is_accelerate, "accelerate launch"),
            (names.is_deepspeed, "deepspeed"),
        ):
            skip = is_it(command)
            if skip:
                module = skip >= 3 and command[skip - 2] == "-m"
                return (f"python -m {command[skip - 1]}" if module else name), command[skip:]
    return None


def waits_for(words: Sequence[str]) -> str | None:
    """The master the launcher's options name (`--master_addr old-host --master_port 29500`,
    `--rdzv-endpoint=h:p`), as written; None when they name none. The options end at the
    first word that is neither an option nor an option's value: the script."""
    found: dict[str, str] = {}
    i = 0
    while i < len(words) and words[i].startswith("-"):
        written, sep, value = words[i].partition("=")
        name = SHORT.get(written) or written.lstrip("-").replace("_", "-")
        takes = not sep and name not in FLAGS and i + 1 < len(words)
        if takes:
            value = words[i + 1]
        if name in ADDRESS + PORT and value:
            found.setdefault(name, value)
        i += 2 if takes else 1
    address = next((found[n] for n in ADDRESS if n in found), None)
    port = next((found[n] for n in PORT if n in found), None)
    if address is None:
        return None
    return f"{address}:{port}" if port and ":" not in address else address


# torchrun's options that place the node in a job, replaced by the cluster's (with dashes).
PLACING = ("nnodes", "node-rank", "nproc-per-node", "master-addr", "master-port", "rdzv-backend",
           "rdzv-endpoint", "rdzv-id", "standalone", "local-addr")  # fmt: skip
ADOPTED = ("torchrun", "python -m torch.distributed.run", "python -m torch.distributed.launch")


def adopt(
    name: str, words: Sequence[str], env: Mapping[str, str]
) -> tuple[list[str], list[str]] | None:
    """A torchrun-like launcher's words with the cluster's numbers in place of those written
    there, read from the variables the entrypoint's torchrun gives its worker (GROUP_WORLD_SIZE,
    GROUP_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and what was replaced
    (`--node_rank=0 -> 1`); None for another launcher, or without those variables."""
    if name not in ADOPTED:
        return None
    try:
        nnodes, node_rank, nproc = (
            int(env[n]) for n in ("GROUP_WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE")
        )
        master, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except (KeyError, ValueError):
        return None
    port = port - 1 if port > 1 else port + 1
    host = f"[{master}]" if ":" in master and not master.startswith("[") else master
    ours = {  # the endpoint and backend too: a platform's PET_RDZV_* would name others
        "nnodes": str(nnodes),
        "node-rank": str(node_rank),
        "nproc-per-node": str(nproc),
        "master-addr": master,
        "master-port": str(port),
        "rdzv-backend": "static",
        "rdzv-endpoint": f"{host}:{port}",
    }
    flags = names.LAUNCH_FLAGS
    kept: list[str] = []
    written: dict[str, str] = {}
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        option, sep, value = words[i].partition("=")
        key = names.SHORT.get(option) or option.lstrip("-").replace("_", "-")
        takes = not sep and key not in flags and i + 1 < len(words)
        if takes:
            value = words[i + 1]
        step = 2 if takes else 1
        if key in PLACING:
            written.setdefault(key, f"{option}={value}" if value else option)
        else:
            kept += words[i : i + step]
        i += step
    changes = [
        f"{text} -> {ours.get(key, '(dropped)')}"
        for key, text in written.items()
        if text.split("=", 1)[-1] != ours.get(key)
    ]
    head = [f"--{k}={v}" for k, v in ours.items()]
    return head + kept + list(words[i:]), changes


def line(
    name: str,
    words: Sequence[str],
    parent: str | None,
    master: str | None = None,
    command: str | None = None,
) -> str:
    """The one line, naming the launcher, the process that started it (`parent`) and the
    command given to the entrypoint, the master it would wait for and the job's (`master`, as
    the entrypoint's torchrun gives its workers)."""
    written = _short(" ".join([name, *words]), 160)
    by = f", started by `{parent}`" if parent and parent != command else ""
    yours = f", in your command `{command}`" if command else ""
    named = waits_for(words)
    ours = f" ({master})" if master else ""
    waits = f", and would wait for {named}, not this job's master{ours}" if named else ""
    return (
        f"{REFUSED} (`{written}`{by}{yours}) would start a job of its own on this node, which "
        f"knows nothing of the other nodes{waits}. Give the launch line to the entrypoint "
        "itself, which adopts it with the cluster's node count, node rank and master: "
        f"entrypoint run -- {name} ... train.py ARGS; or give it the trainer: entrypoint run "
        "-- python train.py ARGS"
    )


def _adopted(
    name: str, words: Sequence[str], new: list[str], changes: list[str], env: Mapping[str, str]
) -> None:
    """Run the launcher with `new` for its words, once a node: in the copy of local rank 0."""
    local, copies = env.get("LOCAL_RANK", "0"), env.get("LOCAL_WORLD_SIZE", "1")
    if local != "0":
        os._exit(0)  # the node's other copies of the command: the launcher runs once a node
    parent = _parent(env.get(NODE_PID))
    by = f"`{parent}`'s " if parent else ""
    n = int(copies) - 1 if copies.isdigit() else 0
    others = {0: "", 1: "; the command's other copy on this node leaves it"}.get(
        n, f"; the command's other {n} copies on this node leave it"
    )
    rendezvous = next(w for w in new if w.startswith("--rdzv-endpoint=")).split("=", 1)[1]
    print(
        f"entrypoint: adopted {by}{name}: {', '.join(changes) or 'no node values written'} "
        f"(this job's: {env.get('GROUP_WORLD_SIZE')} nodes x {copies} process"
        f"{'' if copies == '1' else 'es'}, node rank "
        f"{env.get('GROUP_RANK')}, rendezvous static at {rendezvous}, the port below the job's)"
        f"{others}",
        file=sys.stderr,
        flush=True,
    )
    sys.argv[len(sys.argv) - len(words) :] = new


def _short(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def _cmdline(pid: int) -> tuple[str, int] | None:
    """A process's command line and its parent's pid."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat", "rb") as f:
            ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return " ".join(w.decode(errors="replace") for w in words if w), ppid


def _parent(node: str | None) -> str | None:
    """The command line of the process that started this one, unless it is the entrypoint's own
    launcher (its parent is the node): then the launcher was the command itself (`exec`)."""
    found = _cmdline(os.getppid())
    if found is None or (node is not None and str(found[1]) == node):
        return None
    return _short(found[0], 200) or None


def _command(plan_file: str) -> str | None:
    """The command given to `entrypoint run --`, from the plan."""
    try:
        with open(plan_file) as f:
            trainer = json.load(f)["trainer"]
        return _short(" ".join(str(w) for w in trainer), 200) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def install(env: Mapping[str, str] = os.environ, argv: Sequence[str] | None = None) -> None:
    """In a worker of the entrypoint's launch (its plan file and torchrun's run id set), a
    process that is a launcher is adopted before it reads its options (sys.argv rewritten, in
    the copy of local rank 0; the other copies exit 0), or says so in one line and exits 2."""
    if not env.get(PLAN_VARIABLE) or WORKER_OF_TORCHRUN not in env:
        return
    if env.get(NODE_PID) == str(os.getppid()):
        return  # the node's own launcher (the entrypoint itself runs under a torchrun)
    found = launcher(sys.orig_argv if argv is None else argv)
    if found is None:
        return
    adopted = adopt(*found, env)
    if adopted is not None:
        _adopted(found[0], found[1], *adopted, env)
        return
    ours = ":".join(v for v in (env.get("MASTER_ADDR"), env.get("MASTER_PORT")) if v) or None
    said = line(*found, _parent(env.get(NODE_PID)), ours, _command(env[PLAN_VARIABLE]))
    print(said, file=sys.stderr, flush=True)
    os._exit(EXIT_CONFIG)
