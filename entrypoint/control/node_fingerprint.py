"""What a node's hello carries for node 0 to compare (entrypoint.coordinator.comparison): its
`Fingerprint` (image, Python, the headline packages, the driver, the GPUs, every package), the
summary of its data directory (`DataSummary`) and the job's shape as it planned it
(`PlannedShape`). Collected at the node's edge (entrypoint.supervise.probe, .join); checked field
by field here when it arrives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from entrypoint.control.message_fields import MAX_MEMBER, BadMessage, int_field, str_field

# A fingerprint's fields that node 0 compares across nodes, in the order a mismatch names them.
MATCHED = (
    "image_lock",
    "image_revision",
    "python",
    "torch",
    "jax",
    "deepspeed",
    "nccl",
    "cuda_driver",
    "gpu_model",
    "gpus_per_node",
    "packages",
)
# The job's shape as each node planned it, in the order a mismatch names the fields; each node's
# own `node_rank` rides beside them.
LAYOUT = (
    "nnodes",
    "spares",
    "min_nodes",
    "nproc_per_node",
    "world_size",
    "master_addr",
    "master_port",
    "launcher",
)
# The compared fields that are plain text; the others are checked one by one.
TEXT = tuple(f for f in MATCHED if f not in ("cuda_driver", "gpus_per_node", "packages"))
MAX_PACKAGES = 20_000


@dataclass(frozen=True)
class DataSummary:
    """ENTRYPOINT_DATA_DIR on this node: whether it exists, its file count and total size
    (`partial`: a huge tree, counted up to a limit)."""

    path: str
    exists: bool
    files: int | None = None
    bytes: int | None = None
    partial: bool = False

    @classmethod
    def from_wire(cls, raw: Any) -> DataSummary | None:
        if raw is None:
            return None
        if type(raw) is not dict:
            raise BadMessage("fingerprint.data must be an object or null")
        path, exists = str_field(raw, "path", 4096), raw.get("exists") is True
        if not exists:
            return cls(path, False)
        return cls(
            path,
            True,
            int_field(raw, "files", 0, 1 << 62),
            int_field(raw, "bytes", 0, 1 << 62),
            raw.get("partial") is True,
        )

    def to_wire(self) -> dict:
        if not self.exists:
            return {"path": self.path, "exists": False}
        return asdict(self)


@dataclass(frozen=True)
class PlannedShape:
    """The job's shape as one node planned it, as the platform counts its members (a spare's
    seat is node 0's to give)."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    world_size: int
    master_addr: str
    master_port: int | None
    launcher: str
    spares: int = 0
    min_nodes: int = 1

    @classmethod
    def from_wire(cls, raw: Any) -> PlannedShape:
        if type(raw) is not dict:
            raise BadMessage("fingerprint.layout must be an object")
        return cls(
            nnodes=int_field(raw, "nnodes", 1, MAX_MEMBER),
            node_rank=int_field(raw, "node_rank", 0, MAX_MEMBER),
            spares=int_field(raw, "spares", 0, MAX_MEMBER, 0),
            min_nodes=int_field(raw, "min_nodes", 0, MAX_MEMBER, 1),
            nproc_per_node=int_field(raw, "nproc_per_node", 1, 1 << 16),
            world_size=int_field(raw, "world_size", 1, 1 << 30),
            master_addr=str_field(raw, "master_addr", 1024),
            master_port=int_field(raw, "master_port", 1, 65535, None),
            launcher=str_field(raw, "launcher", 64),
        )

    def to_wire(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Fingerprint:
    """What must be the same on every node (MATCHED), its data directory, and the job's shape
    as it planned it. Empty fields: a hello of another protocol version, not read further."""

    image_lock: str = ""
    image_revision: str = ""
    python: str = ""
    torch: str = ""
    jax: str = ""
    deepspeed: str = ""
    nccl: str = ""
    cuda_driver: str | None = None
    gpu_model: str = ""
    gpus_per_node: int = 0
    packages: Mapping[str, str] = field(default_factory=dict)
    data: DataSummary | None = None
    layout: PlannedShape | None = None

    def value(self, name: str) -> Any:
        """A compared field by its name (MATCHED)."""
        return getattr(self, name)

    @classmethod
    def from_wire(cls, raw: Any) -> Fingerprint:
        if type(raw) is not dict:
            raise BadMessage("fingerprint must be an object")
        text = {key: str_field(raw, key, 512) for key in TEXT}
        driver = raw.get("cuda_driver")
        if driver is not None and (type(driver) is not str or len(driver) > 64):
            raise BadMessage("fingerprint.cuda_driver must be a string or null")
        pkgs = raw.get("packages")
        if (
            type(pkgs) is not dict
            or len(pkgs) > MAX_PACKAGES
            or any(
                type(k) is not str or type(v) is not str or len(k) > 256 or len(v) > 256
                for k, v in pkgs.items()
            )
        ):
            raise BadMessage(
                f"fingerprint.packages must map at most {MAX_PACKAGES} names to versions"
            )
        return cls(
            **text,
            cuda_driver=driver,
            gpus_per_node=int_field(raw, "gpus_per_node", 0, 1 << 16),
            packages=pkgs,
            data=DataSummary.from_wire(raw.get("data")),
            layout=PlannedShape.from_wire(raw.get("layout")),
        )

    def to_wire(self) -> dict:
        """The fingerprint as the hello carries it."""
        wire: dict[str, Any] = {name: self.value(name) for name in MATCHED}
        wire["packages"] = dict(self.packages)
        wire["data"] = self.data.to_wire() if self.data is not None else None
        if self.layout is not None:
            wire["layout"] = self.layout.to_wire()
        return wire
