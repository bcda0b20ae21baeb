"""The ports node 0 opens beside the rendezvous port, as every node derives them: the control
channel's (entrypoint.control.transport) and /metrics' (entrypoint.metrics.collector). One
place, read by the plan, by `entrypoint status` and by `entrypoint render`'s scrape wiring, so
that they agree."""

from __future__ import annotations

from typing import TYPE_CHECKING

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.values import PREFIX, Sourced, derived, env_var

DEFAULT_MASTER_PORT = 29500  # torchrun's: the rendezvous port when nothing names one

if TYPE_CHECKING:  # pydantic stays off `entrypoint --help` and `render`'s path
    from entrypoint.plan.settings import Settings

LAST = 65535


def control_after(master_port: int) -> int:
    """The control port when ENTRYPOINT_CONTROL_PORT is unset: the rendezvous port + 1, or - 1
    when that is the last port."""
    return master_port + 1 if master_port < LAST else master_port - 1


def metrics_after(master_port: int | None, control: int) -> int:
    """The metrics port when ENTRYPOINT_METRICS_PORT is unset: the control port + 1, else the
    nearest free one below it; never the rendezvous or the control port."""
    taken = {master_port, control}
    return next(
        p for p in (control + 1, control - 1, control - 2) if 0 < p <= LAST and p not in taken
    )


def metrics_port(
    settings: Settings, master_port: int | None, control: int | None
) -> Sourced[int | None]:
    """Node 0's /metrics port (entrypoint.metrics.collector): ENTRYPOINT_METRICS_PORT (0: off), else
    the port after the control port (before it, past 65534); off on one node unless set. Never the
    rendezvous or the control port.

    Args:
        settings: the ENTRYPOINT_* settings (`metrics_port`).
        master_port: the rendezvous port (None: torchrun picks one).
        control: node 0's control port (None: any free port, on one node).

    Returns:
        The port (None: off) and its source.

    Raises:
        ConfigError: ENTRYPOINT_METRICS_PORT is the rendezvous or the control port.
    """
    stated = settings.metrics_port
    variable = PREFIX + "METRICS_PORT"
    if stated == 0:
        return Sourced(None, env_var(variable))
    if stated is not None:
        if stated in (master_port, control):
            raise ConfigError(
                variable,
                stated,
                f"is the rendezvous or the control port too (MASTER_PORT={master_port}, "
                f"{PREFIX}CONTROL_PORT={control})",
                f"Pick another free port on node 0, or unset {variable} (default: the control "
                "port + 1)",
            )
        return Sourced(stated, env_var(variable))
    if control is None:
        return Sourced(None, derived(f"single node: off ({variable} unset)"))
    port = metrics_after(master_port, control)
    sign = "+" if port > control else "-"
    return Sourced(port, derived(f"control port {sign} {abs(port - control)} ({variable} unset)"))
