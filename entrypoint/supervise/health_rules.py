"""What a GPU or link event means for the node, as pure functions: NVIDIA's XID codes, the GPU
counters and link states read a moment ago against a moment before, and the text each event
gets in the log and in `/metrics`.

Fatal: the node cannot train until it is serviced (a GPU fallen off the bus, an uncontained or
double-bit ECC error, a row remapping that failed, NVLink or the GSP down, a recovery action that
asks for a reset, a plan NIC or InfiniBand port down). Node 0 takes the node out of the job at
once: a standby takes its seat, or the job stops naming it. Anything else is counted and logged
once: the trainer's own failures (an MMU fault, XID 13 or 31) reach node 0 as its exit anyway.

Sources: NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors) and the resiliency
extension's health checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# XID: (short name, fatal for the node)
XIDS: dict[int, tuple[str, bool]] = {
    13: ("graphics engine exception", False),
    31: ("GPU memory page fault", False),
    43: ("GPU stopped processing", False),
    45: ("preemptive cleanup", False),
    48: ("double-bit ECC error", True),
    61: ("internal micro-controller breakpoint", False),
    62: ("internal micro-controller halt", True),
    63: ("ECC page retirement or row remapping recorded", False),
    64: ("ECC page retirement or row remapping failed", True),
    74: ("NVLink error", True),
    79: ("fallen off the bus", True),
    92: ("high single-bit ECC error rate", False),
    94: ("contained ECC error", False),
    95: ("uncontained ECC error", True),
    109: ("context switch timeout", False),
    119: ("GSP RPC timeout", True),
    120: ("GSP error", True),
    140: ("unrecovered ECC error", True),
    154: ("recovery action changed", True),
}


@dataclass(frozen=True)
class Event:
    """One health event of this node. `kind`: what `/metrics` counts it as (`xid_79`,
    `ecc_uncorrected`, `nvlink_down`, `nic_down`, ...); `where`: the GPU or link."""

    kind: str
    where: str
    text: str
    fatal: bool


def xid_event(gpu: str, xid: int) -> Event:
    """`GPU 3 XID 79 (fallen off the bus)`, fatal as the table says; an unknown XID is not."""
    name, fatal = XIDS.get(xid, ("see NVIDIA's XID catalog", False))
    return Event(f"xid_{xid}", f"GPU {gpu}", f"GPU {gpu} XID {xid} ({name})", fatal)


@dataclass(frozen=True)
class GpuReading:
    """One GPU's counters and links as NVML gives them; None: this GPU or driver has none."""

    ecc_uncorrected: int | None = None
    remap_failed: bool | None = None
    remap_pending: bool | None = None
    nvlinks_up: frozenset[int] | None = None


def gpu_changes(gpu: str, before: GpuReading, now: GpuReading) -> list[Event]:
    """What changed on one GPU since the last reading: new uncorrected ECC errors (counted),
    a row remapping that failed or an NVLink that went down since (fatal)."""
    out = []
    if (
        now.ecc_uncorrected is not None
        and before.ecc_uncorrected is not None
        and now.ecc_uncorrected > before.ecc_uncorrected
    ):
        new = now.ecc_uncorrected - before.ecc_uncorrected
        out.append(
            Event(
                "ecc_uncorrected",
                f"GPU {gpu}",
                f"GPU {gpu}: {new} new uncorrected ECC error(s), "
                f"{now.ecc_uncorrected} since the driver loaded",
                False,
            )
        )
    if now.remap_failed and not before.remap_failed:
        out.append(
            Event(
                "remap_failed",
                f"GPU {gpu}",
                f"GPU {gpu}: row remapping failed (no spare rows left): the GPU needs service",
                True,
            )
        )
    if now.remap_pending and not before.remap_pending:
        out.append(
            Event(
                "remap_pending",
                f"GPU {gpu}",
                f"GPU {gpu}: a row remapping waits for the GPU's reset",
                False,
            )
        )
    if now.nvlinks_up is not None and before.nvlinks_up is not None:
        down = sorted(before.nvlinks_up - now.nvlinks_up)
        if down:
            links = ", ".join(map(str, down))
            out.append(
                Event("nvlink_down", f"GPU {gpu}", f"GPU {gpu}: NVLink {links} went down", True)
            )
    return out


def link_changes(before: Mapping[str, str], now: Mapping[str, str]) -> list[Event]:
    """The plan's NICs (`eth0`: operstate) and InfiniBand ports (`mlx5_0/1`: state) that were up
    and are not: fatal, since NCCL's traffic goes through them."""
    out = []
    for name, was in sorted(before.items()):
        state = now.get(name, "gone")
        if is_up(was) and not is_up(state):
            kind = "ib_port_down" if "/" in name else "nic_down"
            what = "InfiniBand port" if "/" in name else "network interface"
            out.append(Event(kind, name, f"{what} {name} went {state.lower()}", True))
    return out


def is_up(state: str) -> bool:
    """`up` (a NIC's operstate), `unknown` (loopback, some virtual NICs), `4: ACTIVE` (an IB
    port): traffic can pass."""
    state = state.strip().lower()
    return state in ("up", "unknown") or state.endswith("active")


# The oldest Linux driver each CUDA major runs on (NVIDIA's CUDA compatibility tables): a
# driver runs every runtime of the CUDA major it supports, the newer minors included.
DRIVER_FOR_CUDA = {12: "525.60.13", 13: "580.65.06"}


def torch_cuda(version_py: str) -> str | None:
    """The CUDA version torch was built for, from the text of its torch/version.py (read, not
    imported: a second or more); None for a CPU build."""
    for line in version_py.splitlines():
        name, _, value = line.partition("=")
        if name.split(":")[0].strip() == "cuda":
            value = value.strip().strip("'\"")
            return value if value and value != "None" else None
    return None


def driver_misfit(driver_cuda: int, runtime: str) -> tuple[str, str] | None:
    """(reason, fix) when the node's driver (the newest CUDA it runs, as NVML gives it: 12080
    for 12.8) is older than the CUDA major of the image's torch (`runtime`,
    "13.0"): every CUDA call would fail with "driver version is insufficient"."""
    want = int(runtime.split(".")[0])
    have = driver_cuda // 1000
    if have >= want:
        return None
    reason = (
        f"runs CUDA up to {have}.{driver_cuda % 1000 // 10}, older than this image's CUDA "
        f"{runtime} (torch's)"
    )
    older = max((m for m in DRIVER_FOR_CUDA if m <= have), default=None)
    image = (
        f"; or run the CUDA {older} image on this node (make image CUDA={older})" if older else ""
    )
    return (
        reason,
        f"install driver {DRIVER_FOR_CUDA.get(want, 'for CUDA ' + str(want))} or newer{image}",
    )
