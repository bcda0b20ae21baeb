"""entrypoint.cuda_kernels: the architectures in an op's `.nv_fatbin` section, and what they
mean for a GPU (issue 23). The fatbins here are built by hand in the layout nvcc's fatbinary
writes (tests/image/test_deepspeed_ops.py reads the image's real ops and checks this reader
against NVIDIA's cuobjdump)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from entrypoint.doctor import cuda_kernels as ck
from entrypoint.doctor.doctor_checks import Findings, kernel_problems


def entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = struct.pack("<HHIQ", kind, 0x101, 72, len(payload))
    header += struct.pack("<IIII", 0, 0, 0x10007, arch) + bytes(72 - 32)
    return header + payload


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", ck.FATBIN_MAGIC, 1, 16, len(body)) + body


def elf(path: Path, sections: dict[bytes, bytes]) -> Path:
    """A minimal ELF64 little-endian file with these sections (and its section names)."""
    names = b"\0.shstrtab\0" + b"".join(name + b"\0" for name in sections)
    blobs = [names, *sections.values()]
    offsets, at = [], 64
    for blob in blobs:
        offsets.append(at)
        at += len(blob)
    shoff = at
    table = bytes(64)  # the null section
    name_at = {b".shstrtab": 1}
    for name in sections:
        name_at[name] = names.index(b"\0" + name + b"\0") + 1
    for (name, blob), offset in zip(
        [(b".shstrtab", names), *sections.items()], offsets, strict=True
    ):
        table += struct.pack("<IIQQQQIIQQ", name_at[name], 1, 0, 0, offset, len(blob), 0, 0, 1, 0)
    head = b"\x7fELF\x02\x01\x01" + bytes(9)
    head += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(blobs) + 1, 1)
    path.write_bytes(head + b"".join(blobs) + table)
    return path


def test_the_architectures_of_two_containers_one_after_the_other():
    one = fatbin(entry(2, 80, b"a" * 40), entry(1, 90, b"p" * 24), entry(2, 90, b"b" * 16))
    two = fatbin(entry(2, 100, b"c" * 8), entry(2, 120, b"d" * 8))
    padding = bytes(-len(one) % 8 + 8)
    assert ck.fatbin_archs(one + padding + two) == ((80, 90, 100, 120), (90,))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        bytes(100),
        b"\xff" * 64,
        fatbin()[:-1],
        struct.pack("<IHHQ", ck.FATBIN_MAGIC, 1, 16, 10**9),
    ],
)
def test_anything_else_reads_as_no_kernel_without_an_error(data):
    assert ck.fatbin_archs(data) == ((), ())


def test_the_fatbin_section_of_an_elf_file(tmp_path):
    section = fatbin(entry(2, 80, b"x" * 8), entry(1, 90, b"y" * 8))
    so = elf(tmp_path / "op.so", {b".text": b"\x90" * 8, b".nv_fatbin": section})
    assert ck.elf_section(so, b".nv_fatbin") == section
    assert ck.elf_section(so, b".nv_fatbin_absent") is None
    (tmp_path / "not-elf.so").write_bytes(b"#!/bin/sh\n")
    assert ck.elf_section(tmp_path / "not-elf.so", b".nv_fatbin") is None


IMAGE_OPS = ck.Kernels("fused_adam_op", (80, 90, 100, 120), (90,))


@pytest.mark.parametrize(
    ("capability", "verdict"),
    [
        ("8.0", "native"),  # A100
        ("8.6", "native"),  # A40, RTX A6000: sm_80's cubin runs on 8.x from 8.0 up
        ("8.9", "native"),  # L40S
        ("9.0", "native"),  # H100, H200, GH200
        ("10.0", "native"),  # B200, GB200
        ("10.3", "native"),  # B300, GB300
        ("11.0", "ptx"),  # Thor: no cubin of its major, compute_90 PTX compiled by the driver
        ("12.0", "native"),  # RTX PRO 6000 Blackwell, RTX 5090
        ("12.1", "native"),  # GB10 (DGX Spark)
        ("13.0", "ptx"),  # a GPU not sold yet
        ("7.5", "none"),  # T4: older than any cubin or PTX
    ],
)
def test_what_the_image_s_op_means_on_each_gpu(capability, verdict):
    assert ck.coverage(capability, IMAGE_OPS) == verdict


def test_today_s_sm_80_sm_90_op_on_a_blackwell_gpu_is_a_problem_with_its_fix():
    old = ck.Kernels("fused_adam_op", (80, 90), ())
    found = Findings(gpu_capabilities=("10.0",), cuda_ops=(old,))
    (line,) = kernel_problems(found)
    assert line.startswith("DeepSpeed's fused_adam_op: no kernel for this node's GPUs")
    assert "(compute capability 10.0)" in line and "sm_80 sm_90" in line
    assert 'TORCH_CUDA_ARCH_LIST="...;10.0"' in line
    assert kernel_problems(Findings(gpu_capabilities=("9.0",), cuda_ops=(old,))) == []
    assert kernel_problems(Findings(gpu_capabilities=("10.0",), cuda_ops=(IMAGE_OPS,))) == []
