"""A launcher started inside a worker of the entrypoint's launch is adopted where it runs, or
stops at once in one line.

`entrypoint run -- bash start.sh` whose script runs `torchrun ...` (or `python -m
torch.distributed.run`, `python -m torch.distributed.launch`, `accelerate launch`, `deepspeed`,
at any depth of shells): the entrypoint's torchrun runs the script as its worker, one copy per
worker, and the launcher inside knows nothing of the other nodes. It would start a job of its
own on this node, or wait for a master that is not this job's (a script written for machine 0,
`--master_addr` an old address: it waited for minutes, with no line at all). So the site hook
takes it before it reads its options (`install`), in the copy of local rank 0; the node's other
copies leave the launcher at once (exit 0), so that it runs once a node:
- torchrun and its two module forms: the cluster's numbers replace those written there (node
  count, node rank, processes per node, master address, and a port of its own: the rendezvous
  port - 1, as the entrypoint's torchrun holds the rendezvous port); the user's other options
  are kept (`adopt`).
- `accelerate launch`: its config file's settings with the cluster's numbers, written to a file
  of the node's run directory, which the line then names; the line's other options are kept
  (`accelerate`, with trainer_side/accelerate_config.py, which the plan uses too).
- `deepspeed`: torchrun runs the script in its place, on those numbers, giving it
  `--local_rank=N` as DeepSpeed's launcher does (`deepspeed`); its hostfile and the like are
  dropped, as the platform starts the nodes.
- torchrun's agent started from Python, which no command line names (a wrapper calling
  torchrun's `main()`, `elastic_launch`): its LaunchConfig takes the same numbers when it
  reaches `launch_agent` (`agent_config`).
One line names what was replaced. A launcher that cannot be adopted (no cluster numbers, an
accelerate config that cannot run here) stops in one line naming the launcher, the script that
started it and what to change, and exits 2 (a configuration error: every node stops, and a
restart would not help). A launch line the entrypoint is given itself (`entrypoint run --
torchrun ...`) is adopted by the plan (plan/launch_lines.py).

Told apart from the entrypoint's own launcher and what it starts (accelerate's own
subprocesses): torchrun gives its workers TORCHELASTIC_RUN_ID, and the entrypoint's launcher is
its node's child (ENTRYPOINT_NODE_PID)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from entrypoint import EXIT_CONFIG
from entrypoint.trainer_side import accelerate_config
from entrypoint.trainer_side import launcher_names as names
from entrypoint.trainer_side.after_import import when_imported
from entrypoint.trainer_side.world_check import PLAN_VARIABLE

REFUSED = "entrypoint: a launcher inside the command"  # how the node's entrypoint knows the line
WORKER_OF_TORCHRUN = "TORCHELASTIC_RUN_ID"
NODE_PID = "ENTRYPOINT_NODE_PID"  # set by the node for its launcher (supervise/launcher_process)
# The pid of a launcher adopted by exec (deepspeed's line, become torchrun's): not adopted again.
ADOPTED_PID = "ENTRYPOINT_ADOPTED_PID"
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


class Adoption(NamedTuple):
    """A launcher's words with the cluster's numbers, what was replaced (`--node_rank=0 -> 1`),
    the module to run them with instead (None: the launcher itself), the files they need, and
    a note on anything else changed."""

    words: list[str]
    changes: list[str]
    program: str | None = None
    files: Mapping[str, str] = {}
    note: str = ""


def _ours(env: Mapping[str, str]) -> dict[str, str] | None:
    """torchrun's placing options with the cluster's numbers, read from the variables the
    entrypoint's torchrun gives its worker (GROUP_WORLD_SIZE, GROUP_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); None without them."""
    try:
        nnodes, node_rank, nproc = (
            int(env[n]) for n in ("GROUP_WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE")
        )
        master, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except (KeyError, ValueError):
        return None
    port = port - 1 if port > 1 else port + 1
    host = f"[{master}]" if ":" in master and not master.startswith("[") else master
    return {  # the endpoint and backend too: a platform's PET_RDZV_* would name others
        "nnodes": str(nnodes),
        "node-rank": str(node_rank),
        "nproc-per-node": str(nproc),
        "master-addr": master,
        "master-port": str(port),
        "rdzv-backend": "static",
        "rdzv-endpoint": f"{host}:{port}",
    }


def _options(
    words: Sequence[str], flags: frozenset[str], short: Mapping[str, str]
) -> tuple[list[tuple[str, str, list[str]]], list[str]]:
    """A launcher's options before its script, as (name with dashes, value, the words as
    written), and the words from the script on."""
    found: list[tuple[str, str, list[str]]] = []
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        option, sep, value = words[i].partition("=")
        key = short.get(option) or option.lstrip("-").replace("_", "-")
        takes = not sep and key not in flags and i + 1 < len(words)
        if takes:
            value = words[i + 1]
        step = 2 if takes else 1
        found.append((key, value, list(words[i : i + step])))
        i += step
    return found, list(words[i:])


def _written(option: list[str]) -> str:
    return "=".join(option) if len(option) == 2 else option[0]


def adopt(name: str, words: Sequence[str], env: Mapping[str, str]) -> Adoption | None:
    """A torchrun-like launcher's words with the cluster's numbers in place of those written
    there, and what was replaced; None for another launcher, or without the numbers."""
    ours = _ours(env)
    if name not in ADOPTED or ours is None:
        return None
    options, rest = _options(words, names.LAUNCH_FLAGS, names.SHORT)
    kept: list[str] = []
    written: dict[str, str] = {}
    for key, _, option in options:
        if key in PLACING:
            written.setdefault(key, _written(option))
        else:
            kept += option
    changes = [
        f"{text} -> {ours.get(key, '(dropped)')}"
        for key, text in written.items()
        if text.split("=", 1)[-1] != ours.get(key)
    ]
    head = [f"--{k}={v}" for k, v in ours.items()]
    return Adoption(head + kept + rest, changes)


def deepspeed(words: Sequence[str], env: Mapping[str, str]) -> Adoption | None:
    """`deepspeed [options] train.py ARGS` as torchrun's words on the cluster's numbers: the
    script run as DeepSpeed's launcher runs it (`--local_rank=N` after its arguments, unless
    `--no_local_rank`; `--module`, `--no_python`), DeepSpeed's counts and master replaced, its
    options that place nodes (hostfile, include, launcher, ...) dropped; None without the
    numbers or a script."""
    ours = _ours(env)
    options, rest = _options(words, names.DEEPSPEED_FLAGS, names.DEEPSPEED_SHORT)
    if ours is None or not rest:
        return None
    given = {key for key, _, _ in options}
    changes = []
    for key, value, option in options:
        if key in names.DEEPSPEED_KEPT:
            continue
        mine = ours.get(names.DEEPSPEED_AS_TORCHRUN.get(key, ""), "(dropped)")
        if value != mine:
            changes.append(f"{_written(option)} -> {mine}")
    if "no-python" in given:
        trainer = rest
    elif "module" in given:
        trainer = ["python", "-m", *rest]
    else:
        trainer = ["python", *rest]
    if "no-local-rank" in given:
        run = ["--no-python", *trainer]
    else:  # as DeepSpeed's launcher gives it (entrypoint/trainer_side/local_rank_arg.py)
        run = ["--module", "entrypoint.trainer_side.local_rank_arg", *trainer]
    head = [f"--{k}={v}" for k, v in ours.items()]
    return Adoption(head + run, changes, program="torch.distributed.run")


def accelerate(
    words: Sequence[str], env: Mapping[str, str], read: Callable[[str], str | None]
) -> Adoption | None:
    """`accelerate launch [--config_file F] [options] train.py ARGS` with the cluster's numbers:
    F's settings (read by `read`; None: unreadable) and the line's own, the platform's written
    into a file of the node's run directory, which the line names instead; the line's other
    options kept. None without the numbers; accelerate_config.CannotRun for a file that cannot
    run on this node."""
    ours = _ours(env)
    plan_file = env.get(PLAN_VARIABLE)
    if ours is None or not plan_file:
        return None
    options, rest = _options(words, names.ACCELERATE_FLAGS, names.ACCELERATE_SHORT)
    placing = {*names.ACCELERATE_PLATFORM, "num-processes", "config-file"}
    kept = [w for key, _, option in options if key not in placing for w in option]
    given = {key: (value, option) for key, value, option in options}
    path = given["config-file"][0] if "config-file" in given else None
    config = accelerate_config.read(path, read(path)) if path else {}
    numbers = accelerate_config.Numbers(
        int(ours["nnodes"]),
        int(ours["node-rank"]),
        int(ours["nnodes"]) * int(ours["nproc-per-node"]),
        int(ours["nproc-per-node"]),
        ours["master-addr"],
        int(ours["master-port"]),
    )
    on_cpu = env.get("DS_ACCELERATOR") == "cpu"  # the plan's mark of a CPU node
    body, note = accelerate_config.for_node(config, numbers, on_cpu, path)
    changes = []
    for key, (value, option) in given.items():
        name = key.replace("-", "_")
        if key != "config-file" and key in placing and str(body.get(name, "")) != value:
            changes.append(f"{_written(option)} -> {body.get(name, '(dropped)')}")
    for name in accelerate_config.PLATFORM_KEYS:
        if name in config and name.replace("_", "-") not in given:
            mine = body.get(name, "(dropped)")
            if str(config[name]) != str(mine):
                changes.append(f"{name}: {config[name]} in {path} -> {mine}")
    written = f"{os.path.dirname(plan_file)}/accelerate-inner-{ours['node-rank']}.yaml"
    text = (
        f"# Written by the entrypoint for this node from {path or 'no file'} (a start script's "
        "accelerate launch), with this cluster's numbers; do not edit.\n"
        + accelerate_config.as_yaml(body)
    )
    return Adoption(["--config_file", written, *kept, *rest], changes, None, {written: text}, note)


AGENT_API = "torch.distributed.launcher.api"  # where torchrun's agent starts (launch_agent)


def agent_config(config: Any, env: Mapping[str, str]) -> tuple[Any, list[str]] | None:
    """torchrun's LaunchConfig, as a Python wrapper gives it to `launch_agent` (torchrun's
    `main()` called in-process, `elastic_launch`), with the cluster's numbers: node count,
    processes a node, node rank, and a static rendezvous at the port below the job's; what was
    replaced; None without the numbers."""
    import dataclasses

    ours = _ours(env)
    if ours is None:
        return None
    nnodes, nproc = int(ours["nnodes"]), int(ours["nproc-per-node"])
    rank, endpoint = ours["node-rank"], ours["rdzv-endpoint"]
    configs = dict(getattr(config, "rdzv_configs", None) or {})
    was = {
        "nnodes": f"{config.min_nodes}:{config.max_nodes}"
        if config.min_nodes != config.max_nodes
        else str(config.min_nodes),
        "nproc_per_node": str(config.nproc_per_node),
        "node rank": str(configs.get("rank", "(none)")),
        "rendezvous": f"{config.rdzv_backend} at {config.rdzv_endpoint or '(none)'}",
    }
    now = {
        "nnodes": str(nnodes),
        "nproc_per_node": str(nproc),
        "node rank": rank,
        "rendezvous": f"static at {endpoint}",
    }
    changes = [f"{k} {was[k]} -> {now[k]}" for k in was if was[k] != now[k]]
    new = dataclasses.replace(
        config,
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc,
        rdzv_backend="static",
        rdzv_endpoint=endpoint,
        rdzv_configs=configs | {"rank": int(rank)},
        # the static rendezvous keys its store by the run id: every node's the same (a
        # standalone line's is a uuid of each node's own)
        run_id=env.get(WORKER_OF_TORCHRUN, "none"),
    )
    return new, changes


def _wrap_agent(api: Any) -> None:
    """torchrun's agent started from Python inside a worker: adopted as its command line would
    be, once a node (in the copy of local rank 0; the others leave at once, exit 0)."""
    original = api.launch_agent

    def launch_agent(config: Any, entrypoint: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
        adopted = agent_config(config, os.environ)
        if adopted is None:
            return original(config, entrypoint, args, *rest, **kwargs)
        if os.environ.get("LOCAL_RANK", "0") != "0":
            os._exit(0)  # the node's other copies: the agent runs once a node
        new, changes = adopted
        what = " ".join(str(a) for a in [getattr(entrypoint, "__name__", entrypoint), *args])
        _say(f"torchrun's agent started from Python (`{_short(what, 120)}`)", changes, "")
        return original(new, entrypoint, args, *rest, **kwargs)

    api.launch_agent = launch_agent


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


def _adopted(name: str, words: Sequence[str], adoption: Adoption, env: Mapping[str, str]) -> None:
    """Run the launcher adopted, once a node: in the copy of local rank 0."""
    if env.get("LOCAL_RANK", "0") != "0":
        os._exit(0)  # the node's other copies of the command: the launcher runs once a node
    how = {
        "torch.distributed.run": ", run by torchrun"
        + ("" if "--no-python" in adoption.words else " with --local_rank=N as deepspeed gives it")
    }.get(adoption.program or "", "")
    for path, text in adoption.files.items():
        with open(path, "w") as f:
            f.write(text)
    files = "".join(f", in {p}" for p in adoption.files)
    _say(name, adoption.changes, f"{files}{adoption.note}{how}", env)
    if adoption.program is not None:
        os.environ[ADOPTED_PID] = str(os.getpid())  # the same process, exec'd: left alone
        python = sys.executable
        os.execv(python, [python, "-m", adoption.program, *adoption.words])
    sys.argv[len(sys.argv) - len(words) :] = adoption.words


def _say(what: str, changes: list[str], more: str, env: Mapping[str, str] = os.environ) -> None:
    """The node's one line: what was adopted, what was replaced, the job's numbers."""
    parent = _parent(env.get(NODE_PID))
    by = f"`{parent}`'s " if parent else ""
    copies = env.get("LOCAL_WORLD_SIZE", "1")
    n = int(copies) - 1 if copies.isdigit() else 0
    others = {0: "", 1: "; the command's other copy on this node leaves it"}.get(
        n, f"; the command's other {n} copies on this node leave it"
    )
    ours = _ours(env) or {}
    print(
        f"entrypoint: adopted {by}{what}: {', '.join(changes) or 'no node values written'}"
        f"{more} (this job's: {env.get('GROUP_WORLD_SIZE')} nodes x {copies} "
        f"process{'' if copies == '1' else 'es'}, node rank {env.get('GROUP_RANK')}, rendezvous "
        f"static at {ours.get('rdzv-endpoint')}, the port below the job's){others}",
        file=sys.stderr,
        flush=True,
    )


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
    if env.get(ADOPTED_PID) == str(os.getpid()):
        return  # a launcher this hook adopted and exec'd (deepspeed's line as torchrun's)
    found = launcher(sys.orig_argv if argv is None else argv)
    if found is None:  # a wrapper may still start torchrun's agent from Python
        when_imported(AGENT_API, _wrap_agent)
        return
    name, words = found
    parent = _parent(env.get(NODE_PID))
    try:
        if "accelerate" in name:  # `accelerate launch`, `python -m accelerate.commands.launch`
            adoption = accelerate(words, env, _read)
        elif "deepspeed" in name:
            adoption = deepspeed(words, env)
        else:
            adoption = adopt(name, words, env)
    except accelerate_config.CannotRun as refused:
        setting, value, why, fix = refused.args
        written = _short(" ".join([name, *words]), 160)
        by = f", started by `{parent}`" if parent else ""
        print(
            f"{REFUSED} (`{written}`{by}) cannot be adopted: {setting}={value} {why}. {fix}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_CONFIG)
    if adoption is not None:
        _adopted(name, words, adoption, env)
        return
    ours = ":".join(v for v in (env.get("MASTER_ADDR"), env.get("MASTER_PORT")) if v) or None
    said = line(name, words, parent, ours, _command(env[PLAN_VARIABLE]))
    print(said, file=sys.stderr, flush=True)
    os._exit(EXIT_CONFIG)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None
