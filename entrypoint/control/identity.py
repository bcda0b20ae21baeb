"""Which job a node belongs to, and the job's shared secret: what the control channel's
handshake checks before a connection counts as a node of this job (entrypoint.control.transport).

The job identity comes from the platform, the same value on every node of one job and a
different one for the next job: SLURM's job id, the MPI launcher's job namespace, AWS Batch's
job id, SageMaker's training job name, SkyPilot's task id, a JobSet's name; or
ENTRYPOINT_JOB_ID, which `entrypoint render` writes into specs whose platform gives nodes no
such variable (a Kubernetes Job's name). With none, the identity is empty and only the layout
check and the token tell jobs apart.

The token (ENTRYPOINT_JOB_TOKEN, or the file ENTRYPOINT_JOB_TOKEN_FILE names) is the HMAC key
of the handshake: never sent, never logged, never passed to the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from entrypoint.control.messages import AUTH_HMAC, AUTH_NONE
from entrypoint.plan import files, platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.secrets import TOKEN_FILE_VARIABLE, TOKEN_VARIABLE

MIN_TOKEN = 16  # characters: a short token falls to an offline guess from one handshake
# Distinct characters a token needs: 8, or a quarter of its length when shorter than 32. A
# random hex token of 16 or more characters fails this once in more than 10^7 draws;
# `aaaaaaaaaaaaaaaa`, `abababababababab` or `1111222233334444` fail it always.
MIN_DISTINCT = 8
TOKEN_FIX = "Use a random one, e.g. `od -An -tx1 -N32 /dev/urandom | tr -d ' \\n'`"


def job_identity(env: Mapping[str, str], platform: str, job_id: str | None = None) -> str:
    """`VARIABLE=value` naming this node's job: ENTRYPOINT_JOB_ID when set, else what the
    platform's own module says (its `job_identity`), or "" when the platform gives none."""
    if job_id:
        return f"ENTRYPOINT_JOB_ID={job_id}"
    return platforms.module(platform).job_identity(env) if platform in platforms.ORDER else ""


@dataclass(frozen=True)
class Identity:
    """What a node proves at the handshake. The token never appears in repr or a log."""

    job: str = ""
    token: bytes | None = field(default=None, repr=False)

    @property
    def auth(self) -> str:
        return AUTH_HMAC if self.token else AUTH_NONE


def read_token(token: str | None, token_file: Path | None) -> bytes | None:
    """The job's token from ENTRYPOINT_JOB_TOKEN or the file ENTRYPOINT_JOB_TOKEN_FILE names
    (a mounted Kubernetes Secret, a file in the SLURM job's directory); None when neither."""
    if token is not None and token_file is not None:
        raise ConfigError(
            TOKEN_FILE_VARIABLE, token_file, f"{TOKEN_VARIABLE} is set too", "Set one of them"
        )
    variable, shown = TOKEN_VARIABLE, "***"
    if token_file is not None:
        variable, shown = TOKEN_FILE_VARIABLE, str(token_file)
        fix = "Give every node the job's token file (a regular file), or unset it"
        data = files.read_bounded(token_file, files.MAX_TOKEN, variable, fix)
        try:
            token = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ConfigError(variable, shown, "the token is not UTF-8 text", fix) from None
    if token is None:
        return None
    token = token.strip()
    if len(token) < MIN_TOKEN:
        raise ConfigError(
            variable, shown, f"the token is shorter than {MIN_TOKEN} characters", TOKEN_FIX
        )
    distinct, needed = len(set(token)), min(MIN_DISTINCT, len(token) // 4)
    if distinct < needed:
        raise ConfigError(
            variable,
            shown,
            f"the token has {distinct} distinct characters, fewer than {needed}: it is not "
            "random (a guess finds it)",
            TOKEN_FIX,
        )
    return token.encode()
