"""Errors the user can fix: one line, naming the variable, its value and what to do."""

from __future__ import annotations

# Exit codes a platform's retry policy can key on (defined once, at the package's root).
from entrypoint import EXIT_CONFIG, EXIT_HUNG, EXIT_PEERS

__all__ = ["EXIT_CONFIG", "EXIT_HUNG", "EXIT_PEERS"]


class EntrypointError(Exception):
    """The root of the entrypoint's own errors: each is one line (`line()`) and an exit code
    (`exit_code`), and the CLI catches them once, says the line and exits with the code.

    ConfigError (2)        a value the user can fix, named with the fix (plan.errors)
    HostlistError (2)      a SLURM hostlist that cannot be expanded (plan.hostlist; its
                           reader turns it into the ConfigError that names the variable)
    BadMessage (75)        a control line that is not a valid message (control.message_fields)
    PeersError (75)        node 0 or a peer is unavailable, lost or silent (control.transport)
        Refused (2)        another job's node 0, or a wrong token
    ClusterFailed (1)      `entrypoint local`'s cluster: a node failed (local.cluster)
    """

    exit_code: int = EXIT_CONFIG

    def line(self) -> str:
        return str(self)


class ConfigError(EntrypointError):
    """`<VARIABLE>=<value>: what is wrong. What to do.`"""

    exit_code = EXIT_CONFIG

    def __init__(self, variable: str, value: object, problem: str, fix: str) -> None:
        self.variable = variable
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(self.line())

    def line(self) -> str:
        shown = "(unset)" if self.value is None else shorten(str(self.value))
        return f"{self.variable}={shown}: {self.problem}. {self.fix}"


SHOWN = 80  # characters of a long value a line shows: a 120 kB MASTER_ADDR must not fill the log


def shorten(value: str) -> str:
    """repr(value), or for a long one its start and its length: `'aaaa…' (120,000 characters)`."""
    if len(value) <= SHOWN:
        return repr(value)
    start = repr(value[:SHOWN])
    return f"{start[:-1]}…{start[-1]} ({len(value):,} characters)"


def clip(text: str) -> str:
    """text, or for a long one its start and its length: `{"a": [1, 2,… (90,000 characters)`."""
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}… ({len(text):,} characters)"
