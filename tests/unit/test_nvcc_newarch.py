"""docker/nvcc_newarch.py: a compile whose -gencode flags name architectures CUDA 12.4's nvcc
does not know runs nvcc's own steps without them, plus a newer ptxas for each from the newest
PTX, whose cubins the fatbinary step takes (issue 23). The steps below are nvcc 12.4's
`--dryrun` output for `-gencode` sm_80, sm_90 and compute_90, as the image's build prints them;
the whole path runs in the image build (tests/image/test_deepspeed_ops.py lists the result)."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("nvcc_newarch", REPO / "docker" / "nvcc_newarch.py")
nv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nv)

KNOWN = {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90}
ARGS = [
    "-c", "k.cu", "-o", "k.o", "-O3",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
    "-gencode=arch=compute_100,code=sm_100",
    "-gencode", "arch=compute_120,code=sm_120",
]  # fmt: skip
STEPS = [
    "_NVVM_BRANCH_=nvvm",
    "LIBRARIES=  -L/usr/lib/x86_64-linux-gnu/stubs -L/usr/lib/x86_64-linux-gnu",
    'cicc -arch compute_80 -m64 "k.cpp1.ii" -o "keep/k.compute_80.ptx"',
    'ptxas -arch=sm_80 -m64 "keep/k.compute_80.ptx"  -o "keep/k.compute_80.cubin"',
    'cicc -arch compute_90 -m64 "k.cpp1.ii" -o "keep/k.compute_90.ptx"',
    'ptxas -arch=sm_90 -m64 "keep/k.compute_90.ptx"  -o "keep/k.compute_90.sm_90.cubin"',
    'fatbinary --create="keep/k.fatbin" -64 "--image3=kind=elf,sm=80,file=keep/k.compute_80.cubin"'
    ' "--image3=kind=ptx,sm=90,file=keep/k.compute_90.ptx"'
    ' "--image3=kind=elf,sm=90,file=keep/k.compute_90.sm_90.cubin"'
    ' --embedded-fatbin="keep/k.fatbin.c"',
    'gcc -c -x c++ "keep/k.compute_90.cudafe1.cpp" -o "k.o"',
]


def test_the_new_architectures_leave_nvcc_s_arguments_and_are_named():
    kept, new = nv.split(ARGS, KNOWN)
    assert new == [100, 120]
    assert kept == ARGS[:8]  # both spellings of -gencode gone, nothing else touched


def test_nothing_new_is_passed_through_whole():
    assert nv.split(ARGS[:8], KNOWN) == (ARGS[:8], [])


def test_ptx_of_a_new_architecture_is_refused_with_the_fix():
    with pytest.raises(SystemExit, match=r"code=compute_120: .*\(9.0\+PTX\)"):
        nv.split(["-gencode=arch=compute_120,code=compute_120"], KNOWN)


def test_the_new_ptxas_compiles_the_newest_ptx_and_fatbinary_takes_its_cubins(monkeypatch):
    monkeypatch.setattr(nv, "NEW_PTXAS", "/venv/nvidia/cuda_nvcc/bin/ptxas")
    out = nv.with_new_cubins(STEPS, [100, 120])
    at = out.index(STEPS[5])  # right after the compute_90 ptxas step
    added = [shlex.split(line) for line in out[at + 1 : at + 3]]
    for words, arch in zip(added, (100, 120), strict=True):
        assert words[0] == "/venv/nvidia/cuda_nvcc/bin/ptxas"
        assert words[1] == f"-arch=sm_{arch}" and "-m64" in words
        assert words[-3:] == [
            "keep/k.compute_90.ptx",
            "-o",
            f"keep/k.compute_90.new_sm_{arch}.cubin",
        ]
    fatbinary = shlex.split(out[at + 3])
    assert "--image3=kind=elf,sm=100,file=keep/k.compute_90.new_sm_100.cubin" in fatbinary
    assert "--image3=kind=elf,sm=120,file=keep/k.compute_90.new_sm_120.cubin" in fatbinary
    assert out[: at + 1] == STEPS[: at + 1] and out[-1] == STEPS[-1]


def test_nvcc_s_variables_are_exported_to_the_steps_quoted():
    assert nv.shell_line(STEPS[1]) == (
        "export LIBRARIES='  -L/usr/lib/x86_64-linux-gnu/stubs -L/usr/lib/x86_64-linux-gnu'"
    )
    assert nv.shell_line(STEPS[2]) == STEPS[2]


def test_ninja_s_dependency_output_is_taken_out_of_the_dry_run_and_written_after(tmp_path):
    # DeepSpeed's build under ninja (DS_ENABLE_NINJA=1) asks nvcc for a depfile, which
    # `--dryrun` cannot print steps for ("Could not open input file ..._stdout").
    depfile = tmp_path / "k.o.d"
    args = ["--generate-dependencies-with-compile", "--dependency-output", str(depfile), *ARGS]
    kept, found = nv.without_depfile(args)
    assert kept == ARGS and found == str(depfile)
    assert nv.without_depfile(ARGS) == (ARGS, None)
    nv.write_depfile(found, kept)
    assert depfile.read_text() == "k.o: k.cu\n"
