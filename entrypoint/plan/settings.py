"""The entrypoint's own settings: ENTRYPOINT_* variables, validated, each documented.

docs/settings.md's table is generated from these fields (`entrypoint settings --markdown`).
Each setting's text is checked before pydantic parses it (`check_text`, below the class).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, get_args

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from entrypoint.plan import stray_variables
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.values import (
    ETCD_OFF,
    GPUS,
    NODES,
    PER_NODE,
    PREFIX,
    endpoints_from,
    host,
    number,
)

HOUR, DAY, WEEK = 3600, 86400, 7 * 86400
# A node is lost after this many heartbeat intervals of silence at the least: fewer, and one
# late heartbeat of a healthy node stops the job.
MIN_BEATS_PER_TIMEOUT = 3


def given_env(env: Mapping[str, str]) -> dict[str, str]:
    """{field: value} of the ENTRYPOINT_* variables in `env` that name a setting: the prefix
    taken off, each value stripped, a blank one unset. Names are matched as the environment
    spells them, upper case (Linux names are case-sensitive: `entrypoint_nnodes` is another
    variable). pydantic parses the values (`Settings.from_env`). Not pydantic-settings' env
    source: importing pydantic-settings 2.16 alone took 0.33 s in the image (asyncio, its cloud
    providers), more than `entrypoint plan`'s whole budget."""
    fields = Settings.model_fields
    out = {}
    for name, value in env.items():
        field = name[len(PREFIX) :].lower()
        if name.startswith(PREFIX) and name == name.upper() and field in fields and value.strip():
            out[field] = value.strip()
    return out


class Settings(BaseModel):
    """Every ENTRYPOINT_* setting: ENTRYPOINT_<FIELD> in the environment, read by `from_env`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    platform: str = Field(
        "auto", description="Force a platform reading (see the platform table); `auto` detects it."
    )
    world_size_means: Literal["auto", "nodes", "processes"] = Field(
        "auto",
        description=(
            "How to read a bare WORLD_SIZE/RANK pair: as nodes (container platforms) or processes."
        ),
    )
    nnodes: int | None = Field(
        None, ge=1, le=NODES.high, description="Number of nodes; beats the platform's value."
    )
    node_rank: int | None = Field(
        None,
        ge=0,
        le=NODES.high - 1,
        description="This node's index from 0; beats the platform's value.",
    )
    master_addr: str | None = Field(
        None, description="Address of node 0; beats the platform's value."
    )
    master_port: int | None = Field(
        None, ge=1, le=65535, description="Rendezvous port on node 0; beats the platform's value."
    )
    gpus_per_node: int | None = Field(
        None,
        ge=0,
        le=GPUS.high,
        description="GPUs on each node; unset: the platform's count, else a probe (NVML).",
    )
    nproc_per_node: int | None = Field(
        None,
        ge=1,
        le=PER_NODE.high,
        description="Workers per node; default one per GPU, or 1 on CPU.",
    )
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto", description="`cuda` needs GPUs; `auto` uses them when present."
    )
    launcher: Literal["auto", "torchrun", "accelerate", "jax", "direct"] = Field(
        "auto",
        description=(
            "How workers start: torchrun (default), accelerate launch, JAX processes, or direct "
            "exec."
        ),
    )
    job: Literal["deepspeed", "jax"] = Field(
        "deepspeed",
        description=(
            "The built-in job run when no command is given: DeepSpeed ZeRO-2 (torchrun) or JAX "
            "data parallel."
        ),
    )
    config: str | None = Field(
        None,
        description=(
            "Training config: a shipped name (`8gpu`, `16gpu`, `cpu`...) or a directory; default: "
            "chosen by world size."
        ),
    )
    socket_ifname: str | None = Field(
        None,
        description="Network interface for NCCL/gloo; default: the one that routes to the master.",
    )
    run_dir: Path = Field(
        Path("/tmp/entrypoint-run"),
        description=(
            "Where the entrypoint writes the configs it generates for this node (not "
            "/tmp/entrypoint: a directory named like the package would shadow it for `python -m "
            "entrypoint` started in /tmp)."
        ),
    )
    log_dir: Path | None = Field(
        None, description="Also write this node's log to `<log_dir>/node<rank>.log`."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level on node 0."
    )
    log_format: Literal["auto", "console", "json"] = Field(
        "auto", description="`auto`: readable on a terminal, JSON lines otherwise."
    )
    log_all_nodes: bool = Field(
        False, description="Log informative lines on every node, not only node 0."
    )
    xla_preallocate: bool | None = Field(
        None,
        description=(
            "JAX: sets XLA_PYTHON_CLIENT_PREALLOCATE (false stops JAX taking 75% of GPU memory at "
            "start)."
        ),
    )
    xla_mem_fraction: float | None = Field(
        None, gt=0, le=1, description="JAX: sets XLA_PYTHON_CLIENT_MEM_FRACTION."
    )
    control_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=(
            "Port of the entrypoints' own channel on node 0 (join, checks, heartbeats); default "
            "MASTER_PORT + 1 (MASTER_PORT - 1 for 65535); never MASTER_PORT itself."
        ),
    )
    join_timeout: float = Field(
        300,
        gt=0,
        le=WEEK,
        description=(
            "Seconds `run` waits for node 0 to answer and for every node to join before it stops "
            "with exit 75."
        ),
    )
    heartbeat_interval: float = Field(
        1, gt=0, le=HOUR, description="Seconds between heartbeats between the nodes' entrypoints."
    )
    heartbeat_timeout: float = Field(
        5,
        gt=0,
        le=DAY,
        description=(
            "A node silent this long (paused, hung, cut off) is lost: every node stops with exit "
            "75. At least 3 heartbeat intervals."
        ),
    )
    job_id: str | None = Field(
        None,
        description=(
            "Names the job; a node whose job differs is refused at the join. Default: the "
            "platform's job id (SLURM_JOB_ID...), where it has one."
        ),
    )
    job_token: SecretStr | None = Field(
        None,
        description=(
            "A secret shared by the job's nodes (16+ random characters): a node must prove it "
            "(HMAC over a challenge; never sent) to join, and node 0 its own."
        ),
    )
    job_token_file: Path | None = Field(
        None,
        description=(
            "A file holding the job token (a mounted Kubernetes Secret, a file in the job's "
            "directory), instead of ENTRYPOINT_JOB_TOKEN."
        ),
    )
    collective_timeout: int = Field(
        600,
        ge=10,
        le=WEEK,
        description=(
            "Process-group timeout in seconds for a rank that is alive but stuck in a collective "
            "(DEEPSPEED_TIMEOUT, the built-in jobs); node loss is caught by heartbeats long "
            "before."
        ),
    )
    hang_timeout: float | None = Field(
        None,
        ge=0,
        le=WEEK,
        description=(
            "Seconds every rank may go without an optimizer step before the job is hung: node 0 "
            "collects every rank's stack, names the rank not where the others are, and every "
            "node exits 124 (a restart with ENTRYPOINT_MAX_RESTARTS). 0: off. Unset: learned, "
            "max(180, 10 x the longest step after 10 steps), at most 0.75 x "
            "ENTRYPOINT_COLLECTIVE_TIMEOUT or 0.75 x the trainer's own process-group timeout, "
            "whichever is shorter (its ranks report it)."
        ),
    )
    grace_period: float = Field(
        25,
        ge=0,
        le=DAY,
        description=(
            "Seconds workers get after SIGTERM to checkpoint and exit before they are killed; keep "
            "it below the platform's (Kubernetes: terminationGracePeriodSeconds, 30 s)."
        ),
    )
    max_restarts: int = Field(
        0,
        ge=0,
        le=1000,
        description=(
            "Restart every node's trainer together this many times after a worker fails; the "
            "built-in job resumes from its checkpoint."
        ),
    )
    spares: int = Field(
        0,
        ge=0,
        le=NODES.high - 1,
        description=(
            "Standby nodes: the platform starts N+S nodes, the job trains on N and the last S "
            "stand by; a lost node's rank goes to a standby and every trainer restarts from its "
            "checkpoint."
        ),
    )
    min_nodes: int | None = Field(
        None,
        ge=1,
        le=NODES.high,
        description=(
            "With no standby left, a lost node restarts the job on the survivors (ranks "
            "renumbered) while at least this many are alive; unset: a lost node ends the job."
        ),
    )
    etcd: str | None = Field(
        None,
        description=(
            "etcd endpoints (http[s]://HOST:PORT, comma-separated) that hold node 0's seat and the "
            "job's record: with spares or a minimum, a lost node 0 is replaced by a survivor "
            "elected there, and the job goes on. Unset: the job's own etcd, run by its first 3 "
            "(5 from 5) nodes, when it has 3 nodes or more and spares or a minimum; `off`: none "
            "(losing node 0 ends the job)."
        ),
    )
    etcd_cacert: Path | None = Field(
        None,
        description=(
            "ENTRYPOINT_ETCD over https: the CA certificate(s), PEM, that signed etcd's "
            "(etcdctl's --cacert); default: the system's CAs."
        ),
    )
    etcd_cert: Path | None = Field(
        None,
        description=(
            "A client certificate, PEM, for an ENTRYPOINT_ETCD that asks for one (etcd's "
            "--client-cert-auth; etcdctl's --cert), with ENTRYPOINT_ETCD_KEY."
        ),
    )
    etcd_key: Path | None = Field(
        None, description="The key of ENTRYPOINT_ETCD_CERT, PEM (etcdctl's --key)."
    )
    etcd_user: str | None = Field(
        None,
        description=(
            "ENTRYPOINT_ETCD's user where its auth is on (etcdctl's --user), with "
            "ENTRYPOINT_ETCD_PASSWORD; the user needs read and write on the keys under "
            "/multinode/."
        ),
    )
    etcd_password: SecretStr | None = Field(
        None, description="The password of ENTRYPOINT_ETCD_USER (masked like every secret)."
    )
    etcd_port: int | None = Field(
        None,
        ge=1,
        le=65535 - 9,
        description=(
            "The job's own etcd: its member i listens on PORT + 2i (clients) and PORT + 2i + 1 "
            "(its peers); default ENTRYPOINT_CONTROL_PORT + 2 (MASTER_PORT + 3)."
        ),
    )
    max_clock_skew: float = Field(
        30,
        gt=0,
        le=DAY,
        description=(
            "Nodes whose clocks differ from node 0's by more than this many seconds are refused "
            "(above 2 s: a warning)."
        ),
    )
    data_dir: Path | None = Field(
        None,
        description=(
            "A dataset directory that must exist and look the same (file count, size) on every "
            "node."
        ),
    )
    checkpoint_dir: Path | None = Field(
        None,
        description=(
            "The directory the trainer writes its checkpoints to: before every start it must "
            "take a file (written, synced, read back) within 10 s on every node, or the node "
            "fails its health check."
        ),
    )
    health_check: str | None = Field(
        None,
        description=(
            "The site's own health check, an executable run before every start (the first and "
            "each restart): exit 0 is healthy; anything else keeps the node out of the job "
            "with the last line it printed."
        ),
    )
    health_check_timeout: float = Field(
        60,
        gt=0,
        le=DAY,
        description="Seconds ENTRYPOINT_HEALTH_CHECK may run before it counts as failed.",
    )
    health_checks: bool = Field(
        True,
        description=(
            "Check the node before every start (GPUs there and free, no row remapping failed "
            "or pending, the plan's links up, ENTRYPOINT_DATA_DIR, ENTRYPOINT_RUN_DIR and "
            "ENTRYPOINT_CHECKPOINT_DIR answering) and watch NVML's critical events (XID "
            "errors, double-bit ECC), ECC counters, NVLink and the plan's links while it "
            "trains; a fatal finding takes the node out of the job. 0: off."
        ),
    )
    monitor_interval: float = Field(
        300,
        ge=0,
        le=WEEK,
        description=(
            "Node 0 logs a per-node table (GPU utilization and memory) this often, in seconds; 0: "
            "never."
        ),
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description=(
            "Node 0 serves Prometheus metrics of every node at `http://<node 0>:PORT/metrics` "
            "(`entrypoint status` reads them); default ENTRYPOINT_CONTROL_PORT + 1 (MASTER_PORT "
            "+ 2) on a multi-node job, off on one node; 0: off."
        ),
    )
    slow_node_window: float = Field(
        120,
        ge=10,
        le=DAY,
        description=(
            "Seconds a node's GPUs must run below the job's median (utilization, or SM clock) "
            "before node 0 names it as slow; GPU figures arrive every 10 s."
        ),
    )
    strict: bool = Field(
        False,
        description=(
            "An ENTRYPOINT_* variable that is not a setting (a misspelt one) stops the node "
            "before anything starts, instead of a warning."
        ),
    )
    preflight_allreduce: bool = Field(
        False,
        description=(
            "Before the trainer, measure all-reduce bandwidth across all nodes (as `entrypoint "
            "doctor --allreduce`)."
        ),
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """The settings in `env`, each stripped; an empty ENTRYPOINT_* variable is unset. Numbers
        and the master's address go through entrypoint.plan.values' readers; the rest through
        pydantic."""
        given = given_env(env)
        for name, raw in given.items():
            check_text(name, PREFIX + name.upper(), raw, cls.model_fields[name])
        try:
            settings = cls(**given)
        except ValidationError as err:
            first = err.errors()[0]
            name = PREFIX + str(first["loc"][0]).upper()
            raise ConfigError(
                name,
                given.get(str(first["loc"][0])),
                first["msg"].lower(),
                f"Fix {name} or unset it (see `entrypoint settings`)",
            ) from None
        settings._check_heartbeat(given)
        if settings.strict:
            for name in stray_variables.unknown(env, cls.model_fields):
                raise ConfigError(
                    name,
                    env[name],
                    "is not a setting (ENTRYPOINT_STRICT=1)",
                    stray_variables.misspelt_fix(name, cls.model_fields),
                )
        return settings

    def _check_heartbeat(self, given: Mapping[str, str]) -> None:
        """The timeout is relative to the interval, whatever their defaults."""
        need = MIN_BEATS_PER_TIMEOUT * self.heartbeat_interval
        if self.heartbeat_timeout >= need:
            return
        timeout, interval = PREFIX + "HEARTBEAT_TIMEOUT", PREFIX + "HEARTBEAT_INTERVAL"
        why = "one late heartbeat of a healthy node would stop the job"
        if "heartbeat_timeout" in given:
            raise ConfigError(
                timeout,
                given["heartbeat_timeout"],
                f"is below {MIN_BEATS_PER_TIMEOUT} x {interval}="
                f"{self.heartbeat_interval:g} ({need:g} s): {why}",
                f"Raise it to {need:g} or more, or lower {interval}",
            )
        raise ConfigError(
            interval,
            given.get("heartbeat_interval"),
            f"{MIN_BEATS_PER_TIMEOUT} intervals ({need:g} s) exceed {timeout}="
            f"{self.heartbeat_timeout:g}: {why}",
            f"Lower it to {self.heartbeat_timeout / MIN_BEATS_PER_TIMEOUT:g} or "
            f"less, or raise {timeout} to {need:g}",
        )

    def stated(self) -> dict[str, object]:
        """Only the settings the user gave (for `sources`)."""
        return {name: getattr(self, name) for name in self.model_fields_set}


# -- the text of a setting ------------------------------------------------------------------------
# The text of an ENTRYPOINT_* setting, checked before pydantic parses it: numbers in plain ASCII
# digits within the field's own range, paths Linux can hold, the master one host, nothing on two
# lines. Each refusal is the one-line error naming the variable, its value and the fix.

# Settings that name a file or directory (ENTRYPOINT_CONFIG may be a shipped name or a path).
_PATHS = (
    "config",
    "run_dir",
    "log_dir",
    "data_dir",
    "job_token_file",
    "etcd_cacert",
    "etcd_cert",
    "etcd_key",
    "checkpoint_dir",
    "health_check",
)
_DECIMAL = re.compile(r"^(?:[0-9]{1,12}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})$")


def _range(name: str, field: FieldInfo) -> tuple[float, bool, float]:
    """(lowest, whether the lowest itself is allowed, highest) from the field's constraints;
    every numeric setting states both ends."""
    low: float | None = None
    high: float | None = None
    closed = True
    for rule in field.metadata:
        if isinstance(rule, annotated_types.Ge):
            low, closed = float(rule.ge), True  # type: ignore[arg-type]
        elif isinstance(rule, annotated_types.Gt):
            low, closed = float(rule.gt), False  # type: ignore[arg-type]
        elif isinstance(rule, annotated_types.Le):
            high = float(rule.le)  # type: ignore[arg-type]
    if low is None or high is None:
        raise AssertionError(f"setting {name}: a number needs a lowest and a highest value")
    return low, closed, high


def check_text(name: str, variable: str, raw: str, field: FieldInfo) -> None:
    """Numbers in ASCII digits within the field's range (no `inf`, `nan`, `1e3`, `1_000`, sign
    or `²`), and the master one host: each refusal one line naming the range or the fix."""
    if not raw.strip().isprintable():
        raise ConfigError(
            variable,
            "***" if name == "job_token" else raw[:300],
            "holds a control character (a newline, tab...)",
            f"Set {variable} to the value alone, on one line",
        )
    if name == "master_addr":
        host(variable, raw)
        return
    if name == "etcd":
        if raw.strip().lower() == ETCD_OFF:
            return
        try:
            endpoints_from(raw)
        except ValueError as err:
            raise ConfigError(
                variable,
                raw[:300],
                str(err),
                f"Set {variable}=http[s]://HOST:PORT[,...], or {variable}={ETCD_OFF}",
            ) from None
        return
    if name in _PATHS:
        parts = raw.strip().encode(errors="surrogateescape").split(b"/")
        if len(raw) > 4095 or max(len(part) for part in parts) > 255:
            raise ConfigError(
                variable,
                raw[:300],
                "not a usable path (Linux allows 255 bytes per name, 4095 in all)",
                f"Set {variable} to a shorter path",
            )
        return
    annotation = field.annotation
    kinds = {annotation, *get_args(annotation)}
    if not kinds & {int, float}:
        return
    low, closed, high = _range(name, field)
    if int in kinds:
        start = int(low) if closed else int(low) + 1
        number(variable, raw, low=start, high=int(high), example=max(start, 1))
    elif float in kinds:
        text = raw.strip()
        shown = f"{'from' if closed else 'above'} {low:g} to {high:g}"
        if not _DECIMAL.match(text):
            raise ConfigError(
                variable,
                raw,
                "not a number (ASCII digits and at most one '.', such as 30 or 0.5)",
                f"Set {variable} to a number {shown}",
            )
        value = float(text)
        if not math.isfinite(value) or value > high or value < low or (value == low and not closed):
            raise ConfigError(
                variable, raw, f"is outside {shown}", f"Set {variable} to a number {shown}"
            )


def markdown_table() -> str:
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = "unset" if field.default is None else f"`{field.default}`"
        rows.append(f"| `{PREFIX}{name.upper()}` | {default} | {field.description} |")
    return "\n".join(rows)
