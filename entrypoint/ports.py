"""The ports node 0 opens beside the rendezvous port, as every node derives them: the control
channel's (entrypoint.control) and /metrics' (entrypoint.metrics). One place, read by the plan,
by `entrypoint status` and by `entrypoint render`'s scrape wiring, so that they agree."""

from __future__ import annotations

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
