"""Split the one venv into layers by weight and change rate (docker/Dockerfile).

    python venv_layers.py split-lock LOCK OUTDIR       # OUTDIR/<group>.lock, hashes kept
    python venv_layers.py snapshot VENV LIST            # what VENV holds now
    python venv_layers.py move-new VENV LIST OUT        # move what is new since LIST to OUT
    python venv_layers.py split-parts GROUP OUT PARTS   # OUT's files by layer: PARTS/<part>/...

Each group's locked wheels are installed in a stage of their own, into the same empty venv
at the same path, with `uv pip install --require-hashes --no-deps`; `move-new` then moves
the group's files (and nothing of the empty venv) under OUT, which the runtime stage copies
into /opt/venv, one COPY, one layer, per group. A stage's cache key is its own sub-lock,
so a change to one group's pins rebuilds that group's stage only, and the runtime's layers
from that group up. DeepSpeed compiles against torch: its stage mirrors the nvidia, torch and
rest groups' files into its venv by symlink, at their final paths, while it builds.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

# Bottom to top, as the runtime stage stacks them: what changes least often lowest. The
# CUDA libraries move with torch's CUDA line; torch with triton a few times a year; JAX
# monthly; the rest (transformers, accelerate, the hub...) more often; DeepSpeed is
# highest, as it is rebuilt whenever torch or the rest change (its ops compile against
# them), and released every few weeks itself. The project is one more layer above all.
GROUPS: list[tuple[str, str]] = [
    ("nvidia", r"(nvidia-(?!ml-py$).+|cuda-.+)"),  # nvidia-ml-py (pynvml) is no CUDA library
    ("torch", r"(torch|triton)"),
    ("jax", r"(jax|jaxlib|jax-cuda\d+-plugin|jax-cuda\d+-pjrt)"),
    ("rest", r".+"),
    ("deepspeed", r"deepspeed"),
]
# Not "rest", although it is the catch-all: each group's pattern is tried in this order.
MATCH_ORDER = ["nvidia", "torch", "jax", "deepspeed", "rest"]
# A group shipped as several layers, split by path under site-packages: the CUDA wheels are
# 4.8 GB, 54% of the image in one layer, and a cold pull waits for its largest layer. Its
# wheels move together (one CUDA line, with torch), so one stage installs them all; the
# layers are cut by library, largest lowest: cuDNN, cuBLAS, NCCL with NVSHMEM, the math
# libraries, then the runtime, compilers and bindings (the catch-all).
PARTS: dict[str, list[tuple[str, str]]] = {
    "nvidia": [
        ("cudnn", r"nvidia/cudnn/|nvidia_cudnn_"),
        ("cublas", r"nvidia/cublas/|nvidia_cublas[_-]|nvidia/cu\d+/(lib|include)/(lib)?cublas"),
        ("nccl", r"nvidia/(nccl|nvshmem)/|nvidia_(nccl|nvshmem)_"),
        (
            "math",
            r"nvidia/(cusparselt|cusolver|cusparse|cufft|curand)/"
            r"|nvidia_(cusparselt|cusolver|cusparse|cufft|curand)[_-]"
            r"|nvidia/cu\d+/(lib|include)/(lib)?(cusolver|cusparse|cufft|curand)",
        ),
        ("cuda", r""),
    ],
}
# CUDA 12's wheels each have a directory (nvidia/cublas/lib); CUDA 13's toolkit wheels share
# one (nvidia/cu13/lib/libcublas.so.13), while cuDNN, NCCL, NVSHMEM and cuSPARSELt keep theirs.

SITE = "lib/python3.13/site-packages"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==")


def group_of(name: str) -> str:
    patterns = dict(GROUPS)
    name = name.lower().replace("_", "-")
    return next(g for g in MATCH_ORDER if re.fullmatch(patterns[g], name))


def split_lock(text: str) -> dict[str, str]:
    """The lock's entries (pin and hashes) sorted into one sub-lock per group. Its `# via`
    notes are left out: they name what pulled a wheel in, which differs between the CUDA
    lines' locks where the pins do not, and a sub-lock is its stage's cache key (the CUDA 13
    image reuses the CUDA 12 image's `rest` stage)."""
    out: dict[str, list[str]] = {name: [] for name, _ in GROUPS}
    current: str | None = None
    for line in text.splitlines(keepends=True):
        m = PIN.match(line)
        if m:
            current = group_of(m[1])
        elif line[:1] not in (" ", "\t", "\n", ""):
            current = None  # the header's comments
        if current is not None and not line.lstrip().startswith("#"):
            out[current].append(line)
    return {name: "".join(lines) for name, lines in out.items()}


def cmd_split_lock(lock: str, outdir: str) -> None:
    groups = split_lock(Path(lock).read_text())
    empty = [name for name, text in groups.items() if not PIN.search(text)]
    if empty:
        sys.exit(f"{lock}: no pin falls in group(s) {empty}; fix GROUPS in docker/venv_layers.py")
    os.makedirs(outdir, exist_ok=True)
    for name, text in groups.items():
        Path(outdir, f"{name}.lock").write_text(text)
        print(f"{name}: {sum(1 for ln in text.splitlines() if PIN.match(ln))} pins")


def _entries(venv: str):
    for root, dirs, files in os.walk(venv):
        for d in dirs:
            path = os.path.join(root, d)
            if os.path.islink(path):
                files.append(d)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        yield root, "d"
        for f in files:
            st = os.lstat(os.path.join(root, f))
            yield os.path.join(root, f), f"{st.st_size} {st.st_mtime_ns}"


def cmd_snapshot(venv: str, listing: str) -> None:
    with open(listing, "w") as out:
        for path, stat in _entries(venv):
            out.write(f"{stat}\t{path}\n")


def cmd_move_new(venv: str, listing: str, dest: str) -> None:
    """Move every file and directory that is new or changed since the snapshot to
    DEST/<its absolute path>, a new directory in one rename; mode and mtime go with it."""
    if os.path.lexists(os.path.join(venv, ".lock")):
        os.unlink(os.path.join(venv, ".lock"))  # uv's lock on the venv, held while it installs
    before = {}
    for line in Path(listing).read_text().splitlines():
        stat, path = line.split("\t", 1)
        before[path] = stat
    moved = 0
    for root, dirs, files in os.walk(venv):
        for name in list(dirs) + files:
            path = os.path.join(root, name)
            is_dir = name in dirs and not os.path.islink(path)
            if is_dir and before.get(path) == "d":
                continue  # it was there: look inside
            if not is_dir:
                st = os.lstat(path)
                if before.get(path) == f"{st.st_size} {st.st_mtime_ns}":
                    continue
            target = dest + path
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(path, target)
            moved += 1
            if is_dir:
                dirs.remove(name)
    # the parents made above take the modes and times of the venv's own directories
    for root, _dirs, _files in os.walk(dest):
        src = root[len(dest) :] or "/"
        if os.path.isdir(src) and before.get(src) == "d":
            st = os.stat(src)
            os.chmod(root, st.st_mode & 0o7777)
            os.utime(root, ns=(st.st_atime_ns, st.st_mtime_ns))
    if not moved:
        sys.exit(f"{venv}: nothing new since {listing}")
    print(f"moved {moved} new entries of {venv} to {dest}")


def part_of(group: str, path: str) -> str:
    """The layer of `group` a file of its /out tree goes to, by its path under site-packages
    (files elsewhere in the venv go to the catch-all)."""
    relative = path.split(f"/{SITE}/", 1)[1] if f"/{SITE}/" in path else ""
    return next(name for name, rule in PARTS[group] if re.match(rule, relative))


def cmd_split_parts(group: str, out: str, parts: str) -> None:
    """Hard-link every file of OUT (a group's moved files) to PARTS/<part>/<its path>, one
    tree per layer; OUT stays whole for the stages that build against the group."""
    counts = dict.fromkeys((name for name, _ in PARTS[group]), 0)
    for name in counts:
        os.makedirs(os.path.join(parts, name))
    for root, dirs, files in os.walk(out):
        names = files + [d for d in dirs if os.path.islink(os.path.join(root, d))]
        for name in names:
            path = os.path.join(root, name)
            part = part_of(group, path[len(out) :])
            target = os.path.join(parts, part) + path[len(out) :]
            _parents(out, os.path.dirname(path), os.path.join(parts, part))
            if os.path.islink(path):
                os.symlink(os.readlink(path), target)
            else:
                os.link(path, target)
            counts[part] += 1
    empty = [name for name, n in counts.items() if not n]
    if empty:
        sys.exit(f"{group}: no file falls in part(s) {empty}; fix PARTS in docker/venv_layers.py")
    print(", ".join(f"{name}: {n} files" for name, n in counts.items()))


def _parents(out: str, directory: str, dest: str) -> None:
    """DEST/<directory below OUT> and its parents, with their modes and times from OUT."""
    missing = []
    while not os.path.isdir(dest + directory[len(out) :]):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for d in reversed(missing):
        st = os.stat(d)
        os.mkdir(dest + d[len(out) :], st.st_mode & 0o7777)
        os.utime(dest + d[len(out) :], ns=(st.st_atime_ns, st.st_mtime_ns))


COMMANDS = {
    "split-parts": cmd_split_parts,
    "split-lock": cmd_split_lock,
    "snapshot": cmd_snapshot,
    "move-new": cmd_move_new,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](*sys.argv[2:])
