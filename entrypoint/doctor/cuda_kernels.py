"""Which GPU architectures a prebuilt CUDA op can run on: the cubins and PTX in its shared
object's `.nv_fatbin` section, read without CUDA (no driver, no cuobjdump), and what that
means for a GPU of a given compute capability. `entrypoint doctor` says it for this node's
GPUs; tests/image checks the image's ops against the architectures it promises.

A cubin for sm_XY runs on GPUs of the same major version and a minor of Y or more (sm_80 on
an A100 and an A40, sm_90 on an H100, sm_100 on a B200 and a B300, sm_120 on an RTX PRO 6000
and a GB10); PTX for compute_XY is compiled by the driver for any GPU of compute capability
X.Y or newer, at the op's first load (then cached in ~/.nv/ComputeCache)."""

from __future__ import annotations

import importlib.util
import struct
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
_ENTRY = struct.Struct("<HHIQ")  # kind, flags, header size, payload size
_ARCH_AT = 28  # an entry's architecture (80, 90, 100...): a uint32 at this offset
KIND_PTX, KIND_ELF = 1, 2
MAX_SO_BYTES = 1 << 30  # an op's .so is a few MB; a section claiming more is not a fatbin


@dataclass(frozen=True)
class Kernels:
    op: str  # the op's module, "fused_adam_op"
    cubins: tuple[int, ...]  # architectures with machine code: 80, 90, 100, 120
    ptx: tuple[int, ...]  # architectures with PTX: 90

    def text(self) -> str:
        cubins = " ".join(f"sm_{a}" for a in self.cubins) or "no cubin"
        return cubins + (" + PTX " + " ".join(f"compute_{a}" for a in self.ptx) if self.ptx else "")


def fatbin_archs(data: bytes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(cubin architectures, PTX architectures) in a `.nv_fatbin` section: fatbin containers
    one after the other (one per object linked), each 8-byte aligned."""
    cubins: set[int] = set()
    ptx: set[int] = set()
    at = 0
    while at + _HEADER.size <= len(data):
        magic, _version, header, size = _HEADER.unpack_from(data, at)
        if magic != FATBIN_MAGIC:
            at += 8 - at % 8 if at % 8 else 8  # padding between containers
            continue
        entry, end = at + header, min(len(data), at + header + size)
        while entry + _ARCH_AT + 4 <= end:
            kind, _flags, entry_header, payload = _ENTRY.unpack_from(data, entry)
            (arch,) = struct.unpack_from("<I", data, entry + _ARCH_AT)
            {KIND_ELF: cubins, KIND_PTX: ptx}.get(kind, set()).add(arch)
            if entry_header < _ENTRY.size:
                break  # not a fatbin entry: stop rather than loop
            entry += entry_header + payload
        at = max(end, at + 8)
    return tuple(sorted(cubins)), tuple(sorted(ptx))


def elf_section(path: Path, name: bytes) -> bytes | None:
    """The contents of an ELF64 little-endian file's section `name`, None when it has none."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:6] != b"\x7fELF\x02\x01":
            return None
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        if shstrndx >= len(sections):
            return None
        _, _, _, _, names_at, names_size = sections[shstrndx]
        f.seek(names_at)
        names = f.read(min(names_size, MAX_SO_BYTES))
        for name_at, _type, _flags, _addr, offset, size in sections:
            end = names.find(b"\0", name_at)
            if names[name_at:end] == name and size <= MAX_SO_BYTES:
                f.seek(offset)
                return f.read(size)
    return None


def deepspeed_ops() -> tuple[Kernels, ...]:
    """The prebuilt CUDA ops of the installed DeepSpeed (its ops' .so files that hold GPU
    code), found without importing it."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return ()
    found = []
    for so in sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.so")):
        section = elf_section(so, b".nv_fatbin")
        if section:
            cubins, ptx = fatbin_archs(section)
            found.append(Kernels(so.name.split(".")[0], cubins, ptx))
    return tuple(found)


def capability_arch(capability: str) -> int:
    """'9.0' -> 90, '12.0' -> 120."""
    major, minor = capability.split(".")
    return int(major) * 10 + int(minor)


def coverage(capability: str, kernels: Kernels) -> str:
    """'native' (a cubin runs on it), 'ptx' (the driver compiles PTX at first load) or
    'none' (the op cannot run on this GPU)."""
    arch = capability_arch(capability)
    if any(c // 10 == arch // 10 and c <= arch for c in kernels.cubins):
        return "native"
    if any(p <= arch for p in kernels.ptx):
        return "ptx"
    return "none"
