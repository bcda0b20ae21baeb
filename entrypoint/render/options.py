"""`entrypoint render PLATFORM ...`: the options, and the command that writes the spec.

One sub-command per platform, so that `-- CMD ARGS...` can follow the options (argparse gives
the rest of the line to the last positional only when no other positional precedes it) and each
platform's `--help` lists only the options it takes. Values are checked by request.build, so a
bad one is a one-line ConfigError naming the option, not an argparse usage error.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

from entrypoint.plan.errors import ConfigError
from entrypoint.render import TARGETS, module, render
from entrypoint.render.request import (
    DEFAULT_NAME,
    DEFAULT_RUNTIME,
    DEFAULT_TIME,
    MAX_GPUS_PER_NODE,
    MAX_MASTER_PORT,
    MAX_NODES,
    RUNTIMES,
    build,
)

_DESCRIPTION = """Write a complete, commented job spec that runs IMAGE on N nodes of G GPUs each,
to standard output or to FILE. The spec sets only what the entrypoint cannot find out on the node
(how many nodes there are and where node 0 is, where the platform does not say it); `entrypoint
run` in each container does the rest. Secret variables (names with TOKEN, SECRET, PASSWORD or
KEY) are never written into a spec: Kubernetes specs read them from a Secret, the others from the
submitting shell.

Every argument and --env value reaches the job exactly as typed: quoted for YAML 1.1 (kubectl's
reader) in manifests, for bash in scripts, never spanning two lines. Every option is checked as
it is given (names, namespaces, partitions, image references by the OCI grammar, bounded
numbers): a bad one stops render with one line naming it and the fix.

platforms:
{platforms}

options of every platform:
{common}

options of some platforms (`entrypoint render PLATFORM --help` for each):
{more}"""

_EXAMPLE = """example:
  entrypoint render {platform} --nodes 2 --gpus-per-node 8 \\
      --image ghcr.io/org/multinode:1.0{more} -- python train.py --epochs 3"""

_EXAMPLE_MORE = {"slurm": " --runtime pyxis --partition gpu", "docker": " --master-addr 10.0.0.1"}

# The options every platform takes: flags, then argparse keywords.
_COMMON: tuple[tuple[tuple[str, ...], dict], ...] = (
    (("--nodes",), {"metavar": "N", "help": f"number of nodes, 1 to {MAX_NODES} (required)"}),
    (
        ("--gpus-per-node",),
        {
            "metavar": "G",
            "help": f"GPUs on each node, 0 (CPU only) to {MAX_GPUS_PER_NODE} (required)",
        },
    ),
    (("--image",), {"metavar": "IMAGE", "help": "the image to run (required)"}),
    (
        ("--spares",),
        {
            "metavar": "S",
            "help": "standby nodes started beside the N (ENTRYPOINT_SPARES): a lost node's rank "
            "goes to one, and the platform may replace the lost pod (default 0)",
        },
    ),
    (
        ("--min-nodes",),
        {
            "metavar": "M",
            "help": "with no standby left, go on with M to N nodes (ENTRYPOINT_MIN_NODES)",
        },
    ),
    (
        ("--name",),
        {"metavar": "NAME", "help": f"the job's name, lower case (default: {DEFAULT_NAME})"},
    ),
    (
        ("--env",),
        {
            "metavar": "KEY=VALUE",
            "action": "append",
            "default": [],
            "help": "a variable for every node (repeatable); a secret by its name alone",
        },
    ),
    (
        ("-o", "--output"),
        {"metavar": "FILE", "help": "write the spec to FILE (default: standard output)"},
    ),
)

# Options beyond the common ones; each platform module names those it takes in its OPTIONS.
_OPTIONS: dict[str, dict] = {
    "--master-port": {
        "metavar": "PORT",
        "help": f"rendezvous port on node 0, 1 to "
        f"{MAX_MASTER_PORT} (default: the platform's, "
        "or the entrypoint's)",
    },
    "--runtime": {
        "metavar": "RUNTIME",
        "default": DEFAULT_RUNTIME,
        "help": f"how srun runs the image: {', '.join(RUNTIMES)} (none: the nodes run "
        f"the image already) (default: {DEFAULT_RUNTIME})",
    },
    "--time": {
        "metavar": "LIMIT",
        "default": DEFAULT_TIME,
        "help": f"time limit, as sbatch takes it (default: {DEFAULT_TIME})",
    },
    "--partition": {"metavar": "NAME", "help": "SLURM partition"},
    "--account": {"metavar": "NAME", "help": "SLURM account to charge"},
    "--namespace": {"metavar": "NAME", "help": "Kubernetes namespace (default: kubectl's)"},
    "--secret-name": {
        "metavar": "NAME",
        "help": "the Secret that holds the secret --env variables (default: NAME-secrets)",
    },
    "--token": {
        "metavar": "MODE",
        "help": "the control token's Secret NAME-control: required (a pod starts only once it "
        "exists) or optional (a pod without it starts, and any pod that can reach node 0 "
        "with the job's name may join) (default: required)",
    },
    "--master-addr": {
        "metavar": "HOST",
        "help": "machine 0's host name or IP; required for more than one machine",
    },
}
_TRAINER_HELP = "the trainer command (default: the image's built-in job)"


def _listing() -> dict[str, str]:
    """The text of `entrypoint render --help`: every platform and every option."""

    def row(left: str, right: str) -> str:
        return textwrap.fill(
            right, 100, initial_indent=f"  {left:<22} ", subsequent_indent=" " * 25
        )

    common = [row(" ".join(flags) + " " + kw["metavar"], kw["help"]) for flags, kw in _COMMON]
    common.append(row("-- CMD ARGS", _TRAINER_HELP))
    more = [
        row(
            flag + " " + kw["metavar"],
            "["
            + ", ".join(name for name in TARGETS if flag in module(name).OPTIONS)
            + "] "
            + kw["help"],
        )
        for flag, kw in _OPTIONS.items()
    ]
    return {
        "platforms": "\n".join(row(name, module(name).SUMMARY) for name in TARGETS),
        "common": "\n".join(common),
        "more": "\n".join(more),
    }


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add `render` and one sub-command per platform to the entrypoint's sub-commands."""
    parser = subparsers.add_parser(
        "render",
        help="write a job spec for a platform: " + ", ".join(TARGETS),
        description=_DESCRIPTION.format(**_listing()),
        epilog=_EXAMPLE.format(platform="kubernetes", more=""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    platforms = parser.add_subparsers(
        dest="platform", metavar="PLATFORM", required=True, help="one of: " + ", ".join(TARGETS)
    )
    for name in TARGETS:
        platform = module(name)
        sub = platforms.add_parser(
            name,
            description=(platform.__doc__ or "").split("\n\n")[0] + f"\n\nDocs: {platform.DOCS}",
            epilog=_EXAMPLE.format(platform=name, more=_EXAMPLE_MORE.get(name, "")),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for flags, keywords in _COMMON:
            sub.add_argument(*flags, **keywords)
        for flag in platform.OPTIONS:
            sub.add_argument(flag, **_OPTIONS[flag])
        sub.add_argument(
            "trainer", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help=_TRAINER_HELP
        )
    return parser


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def cmd_render(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Build the request from the options, render it, write it."""
    extra = {_dest(flag): getattr(args, _dest(flag), None) for flag in _OPTIONS}
    request = build(
        args.platform,
        nodes=args.nodes,
        spares=args.spares,
        min_nodes=args.min_nodes,
        gpus_per_node=args.gpus_per_node,
        image=args.image,
        name=args.name,
        trainer=args.trainer,
        env=args.env,
        **extra,
    )
    spec = render(request)
    if not args.output:
        sys.stdout.write(spec)
        return 0
    try:
        Path(args.output).write_text(spec)
    except OSError as err:
        raise ConfigError(
            "--output",
            args.output,
            f"cannot be written ({err.strerror})",
            "Name a file in a directory that exists and that you may write",
        ) from None
    print(f"entrypoint: wrote {args.output}", file=sys.stderr)
    return 0
