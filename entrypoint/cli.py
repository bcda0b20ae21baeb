"""`entrypoint`: plan this node's part of a multi-node job, then start it.

Commands:
  plan [--json] [-- CMD...]   print the launch plan; launches nothing
  run [-- CMD...]             plan, check, join the other nodes, then start and supervise the
                              launcher and trainer
  settings [--markdown]       list the ENTRYPOINT_* settings
  render PLATFORM --nodes N --gpus-per-node G --image IMAGE [-- CMD...]
                              write a job spec for SLURM, Kubernetes, Kubeflow, Volcano or docker
  local --nodes N [-- CMD...] run a job as N node containers on this machine (Docker)
  doctor [--json] [--allreduce]
                              check this node (versions, GPUs, network, master), each problem
                              with its fix; --allreduce: measure bandwidth across all nodes
  status [HOST[:PORT]] [--json]
                              every node of a running job, live, from node 0's /metrics
  CMD...                      any other program on PATH (`docker run IMAGE bash`) runs as
                              given: no plan, no supervision; `run -- CMD...` has both
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence

from entrypoint import __version__
from entrypoint.plan.errors import EXIT_CONFIG, EntrypointError
from entrypoint.render import options as render_options

_EPILOG = """Every value comes from, in order: ENTRYPOINT_* settings, the platform's own variables
(SLURM, Kubeflow, torchrun-style, WORLD_SIZE/RANK platforms, MPI, SkyPilot, AWS Batch,
SageMaker, Volcano, Kubernetes Indexed Jobs/JobSet), probes of this node, defaults.
`entrypoint plan` shows each value with its source. `entrypoint settings` lists the settings.
Any other program on PATH runs as given (`docker run IMAGE python -c ...`, `... bash`), with no
plan and no supervision; `entrypoint run -- CMD...` plans, checks and supervises it."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="entrypoint",
        description=(
            "Start this node's part of a multi-node PyTorch, DeepSpeed or JAX job, on any platform."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"entrypoint {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    _add_plan_run_settings(sub)
    render_options.add_parser(sub)  # entrypoint/render: one sub-command per platform

    from entrypoint.local import (
        local_job as local,  # stdlib only at import: the Docker SDK loads when it runs
    )

    local.add_parser(sub)
    _add_doctor(sub)
    from entrypoint.doctor import status  # stdlib only at import: prometheus-client when run

    status.add_parser(sub)
    return parser


def _add_plan_run_settings(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser(
        "plan",
        help="print this node's launch plan; launches nothing",
        description="Print the launch plan this node would follow, with the "
        "source of every value. Launches nothing.",
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.add_argument(
        "trainer",
        nargs=argparse.REMAINDER,
        help="-- CMD ARGS...: the trainer command (default: the built-in job)",
    )

    run = sub.add_parser(
        "run",
        help="plan, check, join the other nodes, then start and "
        "supervise the launcher and the trainer",
        description="Build the plan, check it against this node's hardware, "
        "write the generated configs, join the other nodes (in any "
        "start order; their environments must match), then start "
        "the launcher (torchrun, accelerate, JAX or direct) and "
        "supervise it: heartbeats, signals, failures, restarts.",
    )
    run.add_argument(
        "trainer",
        nargs=argparse.REMAINDER,
        help="-- CMD ARGS...: the trainer command (default: the built-in job)",
    )

    settings = sub.add_parser(
        "settings",
        help="list the ENTRYPOINT_* settings",
        description="List every ENTRYPOINT_* setting with its default.",
    )
    settings.add_argument("--markdown", action="store_true", help="as a Markdown table")


def _add_doctor(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = sub.add_parser(  # entrypoint/doctor/examine.py, imported when it runs
        "doctor",
        help="check this node: versions, GPUs, plan, network, master; each problem with its fix",
        description="Report this node's OS, Python, torch, JAX, DeepSpeed, CUDA, NCCL and driver "
        "versions, its GPUs, the plan, the network interfaces and the one chosen, "
        "and whether the master's name resolves and its ports answer; then each "
        "problem with its fix. Exit 0: no problem; 1: problems; 2: configuration "
        "error. With --allreduce (on every node, like run), measure all-reduce "
        "bandwidth across all nodes.",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.add_argument(
        "--allreduce",
        action="store_true",
        help="then all-reduce across every node (run this on all of them) and "
        "report algorithm and bus bandwidth (gloo on CPU, NCCL on GPUs)",
    )
    doctor.add_argument(
        "--sizes",
        default=None,
        metavar="MIB,...",
        help="with --allreduce: tensor sizes in MiB (default 1,16,64)",
    )
    doctor.add_argument(
        "--iters",
        type=int,
        default=None,
        metavar="N",
        help="with --allreduce: timed calls per size (default 5)",
    )


def _trainer(args: argparse.Namespace) -> list[str] | None:
    rest = list(args.trainer or [])
    if rest and rest[0] == "--":
        rest = rest[1:]
    return rest or None


# Each command imports what it runs, so that --help, --version and render start in ~15 ms:
# the plan's modules bring pydantic (~200 ms), doctor and local more.


def cmd_plan(args: argparse.Namespace, env: dict[str, str]) -> int:
    from entrypoint.plan import secrets
    from entrypoint.supervise import node, report

    plan, _, _ = node.prepare(env, _trainer(args), always_probe_gpus=False)
    values = secrets.secret_values(env)
    if args.json:
        print(json.dumps(secrets.mask_data(plan.to_dict(), values), indent=2))
    else:
        print(report.table(plan, values))
    return 0


def cmd_run(args: argparse.Namespace, env: dict[str, str]) -> int:
    from entrypoint.supervise import node

    plan, facts, settings = node.prepare(env, _trainer(args), always_probe_gpus=True)
    return node.run_plan(plan, facts, env, settings)


def cmd_settings(args: argparse.Namespace, env: dict[str, str]) -> int:
    from entrypoint.plan.settings import Settings, markdown_table

    if args.markdown:
        print(markdown_table())
        return 0
    for name, field in Settings.model_fields.items():
        default = "unset" if field.default is None else field.default
        print(f"ENTRYPOINT_{name.upper():<18} default {default!s:<18} {field.description}")
    return 0


def cmd_doctor(args: argparse.Namespace, env: dict[str, str]) -> int:
    from entrypoint.doctor.examine import cmd_doctor as doctor

    return doctor(args, env)


def cmd_status(args: argparse.Namespace, env: dict[str, str]) -> int:
    from entrypoint.doctor.status import cmd_status as status

    return status(args, env)


def cmd_local(args: argparse.Namespace, env: dict[str, str]) -> int:
    from entrypoint.local.local_job import cmd_local as run_local

    return run_local(args, env)


# A reader that closed stdout (`entrypoint plan | head`) ends the command as it ends git or ls:
# quietly, with the status the shell reports for a process killed by SIGPIPE.
EXIT_BROKEN_PIPE = 128 + 13


def _stdout_closed() -> int:
    # Python flushes stdout again at exit; pointing it at devnull keeps that flush quiet.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file (a test's capture): nothing to flush
        pass
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # a pipe closed after the last print shows here, not at exit
    except BrokenPipeError:
        return _stdout_closed()
    return code


def as_given(argv: Sequence[str]) -> str | None:
    """The program to run as given, when argv names one rather than an entrypoint command."""
    if not argv or argv[0] in HANDLERS or argv[0].startswith("-"):
        return None
    return shutil.which(argv[0])


def _exec_as_given(program: str, argv: Sequence[str]) -> int:
    print(
        f"entrypoint: {argv[0]} is not an entrypoint command: running it as given, with no plan "
        f"and no supervision (entrypoint run -- {argv[0]} ... plans, checks and supervises it)",
        file=sys.stderr,
        flush=True,
    )
    try:
        os.execv(program, list(argv))
    except OSError as err:
        print(f"entrypoint: error: {argv[0]}: {err.strerror}", file=sys.stderr)
    return 127


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    program = as_given(argv)
    if program is not None:
        return _exec_as_given(program, argv)
    parser = _parser()
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if args.command is None:
        parser.print_help()
        return EXIT_CONFIG
    try:
        return HANDLERS[args.command](args, env)
    except EntrypointError as err:
        from entrypoint.supervise import logs

        logs.last_word(f"entrypoint: error: {err.line()}")
        return err.exit_code


# Each command's handler; any other first word that names a program runs as given (as_given).
HANDLERS = {
    "plan": cmd_plan,
    "run": cmd_run,
    "settings": cmd_settings,
    "render": render_options.cmd_render,
    "local": cmd_local,
    "doctor": cmd_doctor,
    "status": cmd_status,
}
