"""What `entrypoint render` was asked for: one frozen value, checked once, that every platform's
renderer reads. Secret values never enter it: a secret variable is kept by name only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from entrypoint.plan.errors import ConfigError
from entrypoint.render import TARGETS, checks, module
from entrypoint.render.quote import shell_join

DEFAULT_NAME = "train"
DEFAULT_TIME = "01:00:00"
DEFAULT_RUNTIME = "pyxis"
RUNTIMES = ("pyxis", "apptainer", "none")

MAX_NODES = 10_000  # a bound, so that `--nodes 1000000000000` is refused, not rendered for hours
MAX_GPUS_PER_NODE = 256
# Node 0 listens on --master-port and on the next port (the entrypoints' own channel).
MAX_MASTER_PORT = 65534


# --token: whether a Kubernetes pod needs the control token's Secret to start (required), or
# starts without it, checked by the job's name alone (optional).
TOKEN_REQUIRED, TOKEN_OPTIONAL = "required", "optional"
TOKEN_MODES = (TOKEN_REQUIRED, TOKEN_OPTIONAL)


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
    spares: int = 0  # standby nodes started beside `nodes` (ENTRYPOINT_SPARES)
    min_nodes: int | None = None  # ENTRYPOINT_MIN_NODES
    token: str = TOKEN_REQUIRED  # Kubernetes platforms: whether pods need the token's Secret

    @property
    def machines(self) -> int:
        """The nodes the platform starts: those that train, and the spares."""
        return self.nodes + self.spares

    @property
    def elastic(self) -> bool:
        """Whether a lost node is replaced or left out (the spec lets the platform replace
        pods) rather than ending the job."""
        return bool(self.spares) or self.min_nodes is not None

    def elastic_env(self) -> list[tuple[str, str]]:
        """The settings every node gets for spares and shrinking (only those given)."""
        out = [("ENTRYPOINT_SPARES", str(self.spares))] if self.spares else []
        if self.min_nodes is not None:
            out.append(("ENTRYPOINT_MIN_NODES", str(self.min_nodes)))
        return out

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
            *(["--spares", str(self.spares)] if self.spares else []),
            *(["--min-nodes", str(self.min_nodes)] if self.min_nodes is not None else []),
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
            ("--token", self.token, TOKEN_REQUIRED),
            ("--master-addr", self.master_addr, None),
            ("--master-port", self.master_port, None),
        ):
            if value != default:
                words += [option, str(value)]
        elastic = dict(self.elastic_env())
        for key, value in self.env:
            if key not in elastic:
                words += ["--env", key if value is None else f"{key}={value}"]
        if self.command:
            words += ["--", *self.command]
        return shell_join(words)


def build(
    platform: str,
    *,
    nodes: str | None,
    gpus_per_node: str | None,
    image: str | None,
    spares: str | None = None,
    min_nodes: str | None = None,
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
    token: str | None = None,
) -> Request:
    """The checked request; a ConfigError names the first bad option, in the order below."""
    _platform_takes(
        platform,
        {
            "--master-port": master_port,
            "--master-addr": master_addr,
            "--runtime": runtime,
            "--time": time,
            "--partition": partition,
            "--account": account,
            "--namespace": namespace,
            "--secret-name": secret_name,
            "--token": token,
        },
    )
    count = checks.number("--nodes", nodes, 1, MAX_NODES, "the number of nodes", "2")
    standby, least = _elastic(spares, min_nodes, count)
    request = Request(
        platform=platform,
        nodes=count,
        gpus_per_node=_gpus(gpus_per_node),
        image=checks.image(image, platform),
        runtime=_runtime(runtime),
        name=_name(name),
        command=checks.command(trainer),
        master_port=_master_port(master_port),
        master_addr=checks.host(master_addr),
        env=checks.env_items(env),
        time=_time(time),
        partition=checks.match("--partition", partition, checks.WORD, PARTITION_WHAT, "gpu"),
        account=checks.match("--account", account, checks.ACCOUNT, "an account name", "myproject"),
        namespace=_k8s_name("--namespace", namespace, NAMESPACE_WHAT, "ml"),
        secret_name=_k8s_name("--secret-name", secret_name, SECRET_WHAT, "train-secrets"),
        spares=standby,
        min_nodes=least,
        token=_token(token),
    )
    _hand_started_need_master(request)
    return replace(request, env=(*request.env, *request.elastic_env()))  # as --env's, to all


def _gpus(gpus_per_node: str | None) -> int:
    return checks.number("--gpus-per-node", gpus_per_node, 0, MAX_GPUS_PER_NODE, GPUS_WHAT, "8")


def _elastic(spares: str | None, min_nodes: str | None, count: int) -> tuple[int, int | None]:
    """--spares (0 to the node limit less --nodes) and --min-nodes (1 to --nodes)."""
    standby = (
        checks.number("--spares", spares, 0, MAX_NODES - count, SPARES_WHAT, "1")
        if spares is not None
        else 0
    )
    if min_nodes is None:
        return standby, None
    least = checks.number("--min-nodes", min_nodes, 1, count, "the fewest nodes to go on", "1")
    return standby, least


def _hand_started_need_master(request: Request) -> None:
    if request.platform == "docker" and request.nodes > 1 and request.master_addr is None:
        raise ConfigError(
            "--master-addr",
            None,
            "machines started by hand need node 0's address",
            "Give --master-addr with machine 0's host name or IP",
        )


GPUS_WHAT = "the GPUs of each node (0: CPU only)"
SPARES_WHAT = "the standby nodes (at most the job's node limit less --nodes)"


def _platform_takes(platform: str, given: dict[str, str | None]) -> None:
    """A platform render knows, and only options it takes."""
    if platform not in TARGETS:
        raise ConfigError(
            "PLATFORM",
            platform,
            "is not a platform render knows",
            f"Use one of: {', '.join(TARGETS)}",
        )
    taken = module(platform).OPTIONS
    for option, value in given.items():
        if value is not None and option not in taken:
            raise ConfigError(
                option,
                value,
                f"is not an option of {platform}",
                f"Drop it; entrypoint render {platform} --help lists its options",
            )


def _master_port(raw: str | None) -> int | None:
    if raw is None:
        return None
    return checks.number(
        "--master-port",
        raw,
        1,
        MAX_MASTER_PORT,
        "a TCP port (node 0 also listens on the next one)",
        "29500",
    )


def _token(raw: str | None) -> str:
    if raw is None:
        return TOKEN_REQUIRED
    if raw not in TOKEN_MODES:
        raise ConfigError(
            "--token",
            raw,
            "is not a token mode",
            f"Use {TOKEN_REQUIRED} (the default: a pod starts only with the job's token "
            f"Secret) or {TOKEN_OPTIONAL} (without it, only the job's name is checked)",
        )
    return raw


def _runtime(raw: str | None) -> str:
    if raw is None:
        return DEFAULT_RUNTIME
    if raw not in RUNTIMES:
        raise ConfigError(
            "--runtime", raw, "is not a runtime render knows", f"Use one of: {', '.join(RUNTIMES)}"
        )
    return raw


def _name(raw: str | None) -> str:
    return (
        checks.match(
            "--name",
            raw,
            checks.NAME,
            "a lower-case name of letters, digits and - (at most 40, starting with a letter)",
            "train-llm",
        )
        or DEFAULT_NAME
    )


def _time(raw: str | None) -> str:
    limit = "a SLURM time limit"
    return checks.match("--time", raw, checks.TIME, limit, "04:00:00 (or 2-00:00:00)") or (
        DEFAULT_TIME
    )


PARTITION_WHAT = "a partition name (letters, digits, _ . - and commas between names)"
NAMESPACE_WHAT = (
    "a Kubernetes namespace (a DNS-1123 label: lower-case letters, digits and -, at most 63)"
)
SECRET_WHAT = "a Kubernetes object name (lower-case letters, digits and -, at most 63)"


def _k8s_name(option: str, raw: str | None, what: str, example: str) -> str | None:
    return checks.match(option, raw, checks.NAMESPACE, what, example)
