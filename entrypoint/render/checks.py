"""The checks of `entrypoint render`'s options, each a function from the option as typed to
its value, or a ConfigError that names the option, the value and the fix. Every pattern is
matched whole (fullmatch) and in ASCII: `$` would let a trailing newline in."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from entrypoint.plan import values
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.secrets import MASK, is_secret
from entrypoint.render.quote import shell_join

# Kubernetes object names (RFC 1035 label); 40 leaves room for `-worker-<i>` and `-node-0-<i>`
# inside the 63-character pod host names the platforms derive from the job's name.
NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", re.ASCII)
# Namespaces and Secrets: DNS-1123 labels.
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
TIME = re.compile(r"[0-9]+-[0-9]+(:[0-9]+){0,2}|[0-9]+(:[0-9]+){0,2}", re.ASCII)
# SLURM partition names, a comma between several (none empty); an account is one name.
WORD = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*", re.ASCII)
ACCOUNT = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", re.ASCII)
_DIGITS = re.compile(r"[0-9]{1,6}", re.ASCII)

# Image references by the OCI distribution grammar (github.com/distribution/reference,
# regexp.go): [domain[:port]/]path[:tag][@digest], path components in lower case.
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = (
    rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
    r"(?::[0-9]+)?"
)
_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?"  # tag
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",  # digest
    re.ASCII,
)
_NAME_MAX = 255  # the grammar's limit on the name part
# SLURM's runtimes also take an image file on a shared file system (squashfs, SIF).
_IMAGE_FILE = re.compile(r"/[A-Za-z0-9._+@/-]+", re.ASCII)
_IMAGE_EXAMPLE = "ghcr.io/org/multinode:1.0"
# Set by the rendered spec or by the platform itself: --env must not shadow them.
_RESERVED = {
    "NNODES",
    "NODE_RANK",
    "ENTRYPOINT_SPARES",
    "ENTRYPOINT_MIN_NODES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GPUS_PER_NODE",
    "JOB_COMPLETION_INDEX",
    "ENTRYPOINT_NNODES",
    "ENTRYPOINT_NODE_RANK",
    "ENTRYPOINT_MASTER_ADDR",
    "ENTRYPOINT_MASTER_PORT",
}
_RESERVED_PREFIXES = ("PET_", "SLURM_", "VC_", "VK_")
# Set by every rendered spec from an option of its own: the fix names that option.
_SET_FROM = {
    "ENTRYPOINT_JOB_ID": "the spec sets it from NAME, the job's name: give that instead",
    "ENTRYPOINT_JOB_TOKEN": "the spec gives every node the job's token already (from the "
    "Secret on Kubernetes, from the submitting shell elsewhere)",
}


def writable(option: str, value: str, shown: str) -> str:
    """A value that can be written at all: no NUL (no argv can carry one), valid Unicode."""
    if "\0" in value:
        raise ConfigError(
            option,
            shown,
            "holds a NUL character, which no command line carries",
            f"Remove it from {option}",
        )
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ConfigError(
            option, shown, "is not valid UTF-8 text", f"Give {option} as UTF-8 text"
        ) from None
    return value


def env_items(items: Sequence[str]) -> tuple[tuple[str, str | None], ...]:
    out: dict[str, str | None] = {}
    for item in items:
        key, has_value, text = item.partition("=")
        shown = f"{key}={MASK}" if has_value and is_secret(key) else item
        if not _ENV_NAME.fullmatch(key):
            raise ConfigError(
                "--env",
                shown,
                "is not KEY=VALUE with a variable name as KEY",
                "Give --env NAME=value, for example --env NCCL_DEBUG=INFO",
            )
        if key in _SET_FROM:
            raise ConfigError(
                "--env", shown, f"the rendered spec sets {key} itself", f"Drop it; {_SET_FROM[key]}"
            )
        if key in _RESERVED or key.startswith(_RESERVED_PREFIXES):
            raise ConfigError(
                "--env",
                shown,
                f"the rendered spec or the platform sets {key}",
                "Drop it; --nodes, --spares, --min-nodes, --gpus-per-node and --master-port "
                "say what you want instead",
            )
        if key in out:
            raise ConfigError("--env", shown, f"{key} is given twice", "Give each variable once")
        value: str | None = None  # a secret: never written, it comes from a Secret or the shell
        if not is_secret(key):
            if not has_value:
                raise ConfigError(
                    "--env",
                    item,
                    "has no value",
                    f"Give --env {key}=value (only secret names, such as HF_TOKEN, "
                    "come without one)",
                )
            value = writable("--env", text, item)
        out[key] = value
    return tuple(out.items())


def match(option: str, raw: str | None, pattern: re.Pattern, what: str, example: str) -> str | None:
    if raw is None:
        return None
    if not pattern.fullmatch(raw):
        raise ConfigError(option, raw, f"is not {what}", f"Give {option} {example}")
    return raw


def number(option: str, raw: str | None, low: int, high: int, what: str, example: str) -> int:
    """ASCII digits inside [low, high]: `²` and `10**30` are refused, and never parsed."""
    if raw is None:
        raise ConfigError(
            option, None, "is required", f"Give {option}, for example {option} {example}"
        )
    if not _DIGITS.fullmatch(raw) or not low <= int(raw) <= high:
        raise ConfigError(
            option,
            raw,
            f"not a whole number from {low} to {high}",
            f"Give {option} {what}, for example {option} {example}",
        )
    return int(raw)


def image(raw: str | None, platform: str) -> str:
    if raw is None:
        raise ConfigError(
            "--image", None, "is required", f"Give --image, for example --image {_IMAGE_EXAMPLE}"
        )
    if platform == "slurm" and _IMAGE_FILE.fullmatch(raw):
        return raw  # a squashfs or SIF file the nodes share
    reference = _REFERENCE.fullmatch(raw)
    if reference and len(reference["name"]) <= _NAME_MAX:
        return raw
    files = " (or, for slurm, an image file's absolute path)" if platform == "slurm" else ""
    lower = _REFERENCE.fullmatch(raw.lower())
    problem = (
        "is not an image reference: the repository must be lower case"
        if lower
        else "is not an image reference ([registry[:port]/]repository[:tag][@digest], "
        "the repository in lower case)"
    )
    raise ConfigError(
        "--image",
        raw,
        problem,
        f"Give --image as registry/repository:tag{files}, for example {_IMAGE_EXAMPLE}",
    )


def host(raw: str | None) -> str | None:
    """machine 0's host name, IPv4 or IPv6 address (not host:port: --master-port says that)."""
    if raw is None:
        return None
    if raw != raw.strip():  # a node would strip it; a spec is written as typed
        raise ConfigError(
            "--master-addr",
            raw,
            "is not a host name (white space around it)",
            "Give --master-addr as one host name or IP address, such as 10.0.0.1",
        )
    bare = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
    try:
        ipaddress.IPv6Address(bare.partition("%")[0])
    except ValueError:
        pass
    else:  # the nodes' own rules (a link-local one needs its zone), kept bare: fd00::2
        return values.host("--master-addr", raw)
    if raw.startswith("[") and "]:" in raw:
        address, _, port_text = raw[1:].partition("]:")
        raise ConfigError(
            "--master-addr",
            raw,
            "is [address]:port, not a host",
            f"Give --master-addr {address} --master-port {port_text}",
        )
    host, colon, port_text = raw.rpartition(":")
    if colon and _HOST.fullmatch(host) and _DIGITS.fullmatch(port_text):
        raise ConfigError(
            "--master-addr",
            raw,
            "is host:port, not a host",
            f"Give --master-addr {host} --master-port {port_text}",
        )
    # The nodes read MASTER_ADDR with this reader: render writes no address they refuse.
    return values.host("--master-addr", raw)


def command(trainer: Sequence[str]) -> tuple[str, ...]:
    rest = list(trainer)
    if rest and rest[0] != "--":
        raise ConfigError(
            "CMD",
            shell_join(rest),
            "comes without -- before it",
            "Put -- between the options and the trainer command, for example -- python train.py",
        )
    if rest[1:] and not rest[1].strip():
        raise ConfigError(
            "CMD",
            rest[1],
            "the trainer's program is an empty word",
            "Give the trainer command after --, e.g. -- python train.py",
        )
    for word in rest[1:]:
        writable("CMD", word, word)
    return tuple(rest[1:])
