"""What `entrypoint render` was asked for: one frozen value, checked once, that every platform's
renderer reads. Secret values never enter it: a secret variable is kept by name only.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from entrypoint.errors import ConfigError
from entrypoint.render.quote import shell_join
from entrypoint.secrets import MASK, is_secret

DEFAULT_NAME = "train"
DEFAULT_TIME = "01:00:00"
DEFAULT_RUNTIME = "pyxis"
RUNTIMES = ("pyxis", "apptainer", "none")

MAX_NODES = 10_000  # a bound, so that `--nodes 1000000000000` is refused, not rendered for hours
MAX_GPUS_PER_NODE = 256
# Node 0 listens on --master-port and on the next port (the entrypoints' own channel).
MAX_MASTER_PORT = 65534

# Every pattern is matched whole (fullmatch) and in ASCII: `$` would let a trailing newline in.
# Kubernetes object names (RFC 1035 label); 40 leaves room for `-worker-<i>` and `-node-0-<i>`
# inside the 63-character pod host names the platforms derive from the job's name.
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", re.ASCII)
# Namespaces and Secrets: DNS-1123 labels.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME = re.compile(r"[0-9]+-[0-9]+(:[0-9]+){0,2}|[0-9]+(:[0-9]+){0,2}", re.ASCII)
# SLURM partition and account names; a comma separates several partitions.
_WORD = re.compile(r"[A-Za-z0-9_.,-]+", re.ASCII)
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


@dataclass(frozen=True)
class Request:
    """One job: `nodes` machines with `gpus_per_node` GPUs each, all running `image`."""

    platform: str
    nodes: int
    gpus_per_node: int
    image: str
    name: str = DEFAULT_NAME
    command: tuple[str, ...] = ()  # the trainer; empty: the image's built-in job
    master_port: int | None = None  # None: the platform's or the entrypoint's default
    master_addr: str | None = None  # docker only: machine 0's address
    # (name, value); value None for a secret, which the spec takes from elsewhere.
    env: tuple[tuple[str, str | None], ...] = ()
    runtime: str = DEFAULT_RUNTIME  # slurm only
    time: str = DEFAULT_TIME  # slurm only
    partition: str | None = None  # slurm only
    account: str | None = None  # slurm only
    namespace: str | None = None  # Kubernetes platforms only
    secret_name: str | None = None  # Kubernetes platforms: the Secret holding secret --env names

    @property
    def secret(self) -> str:
        return self.secret_name or f"{self.name}-secrets"

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(name for name, value in self.env if value is None)

    @property
    def nproc_per_node(self) -> int:
        """Workers per node as the entrypoint will choose them: one per GPU, one on CPU."""
        return max(self.gpus_per_node, 1)

    def entrypoint_args(self) -> list[str]:
        """The image's entrypoint arguments: `run`, then the trainer after `--`."""
        return ["run", "--", *self.command] if self.command else ["run"]

    def command_line(self) -> str:
        """The `entrypoint render` command that gives this spec again (secrets by name only)."""
        words = [
            "entrypoint",
            "render",
            self.platform,
            "--nodes",
            str(self.nodes),
            "--gpus-per-node",
            str(self.gpus_per_node),
            "--image",
            self.image,
        ]
        if self.name != DEFAULT_NAME:
            words += ["--name", self.name]
        for option, value, default in (
            ("--runtime", self.runtime, DEFAULT_RUNTIME),
            ("--time", self.time, DEFAULT_TIME),
            ("--partition", self.partition, None),
            ("--account", self.account, None),
            ("--namespace", self.namespace, None),
            ("--secret-name", self.secret_name, None),
            ("--master-addr", self.master_addr, None),
            ("--master-port", self.master_port, None),
        ):
            if value != default:
                words += [option, str(value)]
        for key, value in self.env:
            words += ["--env", key if value is None else f"{key}={value}"]
        if self.command:
            words += ["--", *self.command]
        return shell_join(words)


def _text(option: str, value: str, shown: str) -> str:
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


def _env(items: Sequence[str]) -> tuple[tuple[str, str | None], ...]:
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
        if key in _RESERVED or key.startswith(_RESERVED_PREFIXES):
            raise ConfigError(
                "--env",
                shown,
                f"the rendered spec or the platform sets {key}",
                "Drop it; --nodes, --gpus-per-node and --master-port say what you want instead",
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
            value = _text("--env", text, item)
        out[key] = value
    return tuple(out.items())


def _match(
    option: str, raw: str | None, pattern: re.Pattern, what: str, example: str
) -> str | None:
    if raw is None:
        return None
    if not pattern.fullmatch(raw):
        raise ConfigError(option, raw, f"is not {what}", f"Give {option} {example}")
    return raw


def _number(option: str, raw: str | None, low: int, high: int, what: str, example: str) -> int:
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


def _image(raw: str | None, platform: str) -> str:
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


def _host(raw: str | None) -> str | None:
    """machine 0's host name, IPv4 or IPv6 address (not host:port: --master-port says that)."""
    if raw is None:
        return None
    bare = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
    try:
        ipaddress.IPv6Address(bare)
        return raw
    except ValueError:
        pass
    if _HOST.fullmatch(raw):
        return raw
    host, colon, port_text = raw.rpartition(":")
    if colon and _HOST.fullmatch(host) and _DIGITS.fullmatch(port_text):
        raise ConfigError(
            "--master-addr",
            raw,
            "is host:port, not a host",
            f"Give --master-addr {host} --master-port {port_text}",
        )
    raise ConfigError(
        "--master-addr",
        raw,
        "is not a host name or IP address",
        "Give --master-addr 10.0.0.1 (machine 0's address)",
    )


def _command(trainer: Sequence[str]) -> tuple[str, ...]:
    rest = list(trainer)
    if rest and rest[0] != "--":
        raise ConfigError(
            "CMD",
            shell_join(rest),
            "comes without -- before it",
            "Put -- between the options and the trainer command, for example -- python train.py",
        )
    for word in rest[1:]:
        _text("CMD", word, word)
    return tuple(rest[1:])


def build(
    platform: str,
    *,
    nodes: str | None,
    gpus_per_node: str | None,
    image: str | None,
    name: str | None = None,
    trainer: Sequence[str] = (),
    master_port: str | None = None,
    master_addr: str | None = None,
    env: Sequence[str] = (),
    runtime: str | None = None,
    time: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    namespace: str | None = None,
    secret_name: str | None = None,
) -> Request:
    """The checked request, from the options as typed; a ConfigError names the bad option."""
    from entrypoint.render import PLATFORMS, module

    if platform not in PLATFORMS:
        raise ConfigError(
            "PLATFORM",
            platform,
            "is not a platform render knows",
            f"Use one of: {', '.join(PLATFORMS)}",
        )
    taken = module(platform).OPTIONS
    for option, value in (
        ("--master-port", master_port),
        ("--master-addr", master_addr),
        ("--runtime", runtime),
        ("--time", time),
        ("--partition", partition),
        ("--account", account),
        ("--namespace", namespace),
        ("--secret-name", secret_name),
    ):
        if value is not None and option not in taken:
            raise ConfigError(
                option,
                value,
                f"is not an option of {platform}",
                f"Drop it; entrypoint render {platform} --help lists its options",
            )
    nodes_count = _number("--nodes", nodes, 1, MAX_NODES, "the number of nodes", "2")
    gpus = _number(
        "--gpus-per-node",
        gpus_per_node,
        0,
        MAX_GPUS_PER_NODE,
        "the GPUs of each node (0: CPU only)",
        "8",
    )
    image = _image(image, platform)
    if runtime is None:
        runtime = DEFAULT_RUNTIME
    elif runtime not in RUNTIMES:
        raise ConfigError(
            "--runtime",
            runtime,
            "is not a runtime render knows",
            f"Use one of: {', '.join(RUNTIMES)}",
        )
    request = Request(
        platform=platform,
        nodes=nodes_count,
        gpus_per_node=gpus,
        image=image,
        name=_match(
            "--name",
            name,
            _NAME,
            "a lower-case name of letters, digits and - (at most 40, starting with a letter)",
            "train-llm",
        )
        or DEFAULT_NAME,
        command=_command(trainer),
        master_port=None
        if master_port is None
        else _number(
            "--master-port",
            master_port,
            1,
            MAX_MASTER_PORT,
            "a TCP port (node 0 also listens on the next one)",
            "29500",
        ),
        master_addr=_host(master_addr),
        env=_env(env),
        runtime=runtime,
        time=_match("--time", time, _TIME, "a SLURM time limit", "04:00:00 (or 2-00:00:00)")
        or DEFAULT_TIME,
        partition=_match(
            "--partition",
            partition,
            _WORD,
            "a partition name (letters, digits, _ . - and commas between names)",
            "gpu",
        ),
        account=_match("--account", account, _WORD, "an account name", "myproject"),
        namespace=_match(
            "--namespace",
            namespace,
            _NAMESPACE,
            "a Kubernetes namespace (a "
            "DNS-1123 label: lower-case letters, digits and -, at most 63)",
            "ml",
        ),
        secret_name=_match(
            "--secret-name",
            secret_name,
            _NAMESPACE,
            "a Kubernetes object name (lower-case letters, digits and -, at most 63)",
            "train-secrets",
        ),
    )
    if platform == "docker" and request.nodes > 1 and request.master_addr is None:
        raise ConfigError(
            "--master-addr",
            None,
            "machines started by hand need node 0's address",
            "Give --master-addr with machine 0's host name or IP",
        )
    return request
