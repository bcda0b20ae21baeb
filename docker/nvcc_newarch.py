#!/usr/bin/env python3
"""nvcc for GPU architectures newer than the toolkit's: Debian's CUDA 12.4 compiles, a newer
ptxas adds the cubins 12.4 cannot make (docker/Dockerfile's venv-deepspeed stage puts this
file in place of /usr/bin/nvcc while DeepSpeed's ops build; nothing of it ships).

    nvcc_newarch.py NVCC-ARGS...        (NVCC, NEW_PTXAS: the two compilers, from the environment)

Why: no CUDA toolkit that targets sm_100 (B200, GB200) or sm_120 (RTX PRO 6000, RTX 50xx)
installs offline from Debian (trixie has 12.4, experimental 12.5; sm_100 needs 12.8), and
NVIDIA's CUDA wheels on PyPI hold ptxas and libnvvm but no nvcc driver, no cicc and no
fatbinary. ptxas is the part that knows an architecture: it turns PTX into that GPU's
machine code (a cubin), as the driver's JIT does on a GPU with no cubin. So, for a compile
whose `-gencode` flags name architectures 12.4 does not know:

1. nvcc 12.4 is asked for its steps (`--dryrun --keep`) with those flags left out;
2. the steps run as nvcc would run them, and after the ptxas step for the newest PTX
   (compute_90), the newer ptxas (NEW_PTXAS: the locked nvidia-cuda-nvcc-cu12 wheel's, CUDA
   12.9) compiles that PTX for each new sm_XY with the same options;
3. the fatbinary step takes those cubins as well, so the object, and the op's .so, hold
   cubins for the old and the new architectures, and the compute_90 PTX.

PTX can only come from the front end (cicc): a `code=compute_XY` newer than 12.4's is
refused. compute_90 PTX is also the one that serves the most future GPUs: a driver compiles
it for any architecture from 9.0 up, where compute_120 PTX would not run on sm_100 or sm_103.
Any other nvcc call is passed through unchanged. A compile that ninja asks for its header
dependencies (`--generate-dependencies-with-compile`: DeepSpeed's build with DS_ENABLE_NINJA)
gets a dependency file naming the source alone.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile

NVCC = os.environ.get("NVCC", "/usr/lib/nvidia-cuda-toolkit/bin/nvcc")
NEW_PTXAS = os.environ.get("NEW_PTXAS", "")
GENCODE = re.compile(r"^-gencode(?:=|$)")
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
PAIR = re.compile(r"arch=compute_(\d+)a?,code=\[?([a-z_0-9,]+)\]?$")


def known_archs() -> set[int]:
    out = subprocess.run([NVCC, "--list-gpu-code"], capture_output=True, text=True, check=True)
    return {int(m[1]) for m in re.finditer(r"sm_(\d+)", out.stdout)}


def gencodes(args: list[str]) -> list[tuple[int, int, str]]:
    """(index in args, compute arch, code) of each -gencode, in either spelling."""
    found = []
    for i, arg in enumerate(args):
        if not GENCODE.match(arg):
            continue
        value = arg.split("=", 1)[1] if arg.startswith("-gencode=") else args[i + 1]
        m = PAIR.match(value)
        if not m:
            sys.exit(f"nvcc_newarch: cannot read {arg} {value}")
        for code in m[2].split(","):
            found.append((i, int(m[1]), code))
    return found


def split(args: list[str], known: set[int]) -> tuple[list[str], list[int]]:
    """The arguments without the gencodes for new architectures, and those architectures."""
    drop, new = set(), []
    for i, arch, code in gencodes(args):
        if arch in known:
            continue
        if code.startswith("compute_"):
            sys.exit(
                f"nvcc_newarch: code={code}: PTX for an architecture newer than "
                f"{max(known) // 10}.{max(known) % 10} needs a newer CUDA front end than this "
                "nvcc's; ask for the newest it knows with +PTX instead (9.0+PTX)"
            )
        new.append(int(code.removeprefix("sm_")))
        drop |= {i} if args[i].startswith("-gencode=") else {i, i + 1}
    return [a for i, a in enumerate(args) if i not in drop], sorted(set(new))


def steps(args: list[str], keep: str) -> list[str]:
    out = subprocess.run(
        [NVCC, *args, "--dryrun", "--keep", f"--keep-dir={keep}"],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        sys.stderr.write(out.stderr)
        sys.exit(out.returncode)
    return [line[3:] for line in out.stderr.splitlines() if line.startswith("#$ ")]


def newest_ptx(lines: list[str]) -> tuple[int, str]:
    """The ptxas step compiling the PTX of the newest compute architecture: its index."""
    best = (-1, -1)
    for n, line in enumerate(lines):
        words = shlex.split(line)
        if words and os.path.basename(words[0]) == "ptxas":
            ptx = next(w for w in words[1:] if w.endswith(".ptx"))
            arch = int(re.search(r"compute_(\d+)", ptx)[1])
            best = max(best, (arch, n))
    if best[1] < 0:
        sys.exit("nvcc_newarch: nvcc's steps have no ptxas step to start from")
    return best[1], lines[best[1]]


def with_new_cubins(lines: list[str], new: list[int]) -> list[str]:
    at, ptxas = newest_ptx(lines)
    words = shlex.split(ptxas)
    ptx = next(w for w in words[1:] if w.endswith(".ptx"))
    cubins = {arch: ptx.removesuffix(".ptx") + f".new_sm_{arch}.cubin" for arch in new}
    extra = []
    for arch, cubin in cubins.items():
        flags, skip = [], False
        for w in words[1:]:
            if skip:
                skip = False
            elif w == "-o":
                skip = True
            elif not (w.startswith("-arch") or w == ptx):
                flags.append(w)
        extra.append(shlex.join([NEW_PTXAS, f"-arch=sm_{arch}", *flags, ptx, "-o", cubin]))
    out = [*lines[: at + 1], *extra, *lines[at + 1 :]]
    for n, line in enumerate(out):
        if shlex.split(line)[:1] and os.path.basename(shlex.split(line)[0]) == "fatbinary":
            images = [f"--image3=kind=elf,sm={arch},file={c}" for arch, c in cubins.items()]
            out[n] = line + " " + shlex.join(images)
            return out
    sys.exit("nvcc_newarch: nvcc's steps have no fatbinary step")


def shell_line(line: str) -> str:
    """A step as --dryrun prints it, for bash: nvcc's variables (`LIBRARIES=  -L...`,
    `NVVMIR_LIBRARY_DIR=...`) exported to the steps, as nvcc does; commands as they are."""
    m = ASSIGNMENT.match(line)
    return f"export {m[1]}={shlex.quote(m[2])}" if m else line


def without_depfile(args: list[str]) -> tuple[list[str], str | None]:
    """The arguments without ninja's dependency output (`--generate-dependencies-with-compile
    --dependency-output FILE`, which `--dryrun` cannot print steps for), and FILE."""
    out, depfile, skip = [], None, False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--generate-dependencies-with-compile":
            continue
        elif arg == "--dependency-output":
            depfile, skip = args[i + 1], True
        else:
            out.append(arg)
    return out, depfile


def write_depfile(path: str, args: list[str]) -> None:
    """The object depends on its source: enough for a build tree made once and thrown away
    (the image's); a changed header is not seen."""
    obj = args[args.index("-o") + 1]
    source = next(a for a in args if a.endswith(".cu"))
    with open(path, "w") as f:
        f.write(f"{obj}: {source}\n")


def main(args: list[str]) -> int:
    known = known_archs()
    kept, new = split(args, known)
    if not new:
        return subprocess.call([NVCC, *args])
    if not NEW_PTXAS or not os.access(NEW_PTXAS, os.X_OK):
        sys.exit(f"nvcc_newarch: NEW_PTXAS={NEW_PTXAS!r}: no ptxas for sm_{new}")
    kept, depfile = without_depfile(kept)
    with tempfile.TemporaryDirectory(prefix="nvcc-newarch-") as keep:
        lines = with_new_cubins(steps(kept, keep), new)
        script = "set -e\n" + "\n".join(map(shell_line, lines)) + "\n"
        status = subprocess.call(["bash", "-c", script])
    if status == 0 and depfile:
        write_depfile(depfile, kept)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
