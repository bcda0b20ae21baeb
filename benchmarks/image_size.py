"""How big the image is and how long it takes to build. Prints figures; asserts nothing.

    python benchmarks/image_size.py [--image multinode:dev] [--no-gzip] [--rebuild] [--cold]

Always: uncompressed size, compressed size (`docker save | gzip`, what a registry-less
transfer ships), the five largest layers, and the floor: the installed size of the
image's own venv. --rebuild times a no-change rebuild and a rebuild after an
entrypoint-only change (in a copy of the tree). --cold prunes the BuildKit cache and
times a full build: slow (about half an hour on 2 cores) and it empties the caches.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GB = 1e9

# Published sizes of the usual alternatives, for scale. Not measured here (no registry
# can be reached from the build machines); read off the registries' tag pages, compressed
# as pulled. Check the current figures on those pages before quoting them.
PUBLISHED = [
    (
        "pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime (torch only, conda)",
        "https://hub.docker.com/r/pytorch/pytorch/tags",
        "about 3.4 GB compressed",
    ),
    (
        "nvcr.io/nvidia/pytorch:25.10-py3 (NGC PyTorch, with CUDA toolkit and compilers)",
        "https://catalog.ngc.nvidia.com/orgs/nvidia/containers/pytorch/tags",
        "about 10 GB compressed, ~20 GB on disk",
    ),
]


def docker_client() -> str:
    if os.environ.get("DOCKER"):
        return os.environ["DOCKER"]
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"


DOCKER = docker_client()


def sh(*argv: str, **kw) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def image_size(image: str) -> int:
    return int(sh(DOCKER, "image", "inspect", "--format", "{{.Size}}", image))


def gzip_size(image: str) -> int:
    """Bytes of `docker save IMAGE | gzip` (level 6, gzip's default), streamed."""

    class Counter:
        n = 0

        def write(self, b):
            self.n += len(b)

        def flush(self):
            pass

    counter = Counter()
    proc = subprocess.Popen([DOCKER, "save", image], stdout=subprocess.PIPE)
    with gzip.GzipFile(fileobj=counter, mode="wb", compresslevel=6) as gz:
        shutil.copyfileobj(proc.stdout, gz, 1 << 20)
    if proc.wait() != 0:
        raise SystemExit("docker save failed")
    return counter.n


def layers(image: str) -> list[tuple[int, str]]:
    out = sh(
        DOCKER,
        "history",
        "--no-trunc",
        "--human=false",
        "--format",
        "{{.Size}}\t{{.CreatedBy}}",
        image,
    )
    rows = []
    for line in out.splitlines():
        size, _, created_by = line.partition("\t")
        rows.append((int(size), " ".join(created_by.split()) or "(the base image's layer)"))
    return sorted(rows, reverse=True)


def venv_size(image: str) -> tuple[int, int]:
    out = sh(
        DOCKER,
        "run",
        "--rm",
        "--entrypoint",
        "sh",
        image,
        "-c",
        (
            "du -sb /opt/venv | cut -f1; du -sbc /opt/venv/lib/python3*/site-packages/nvidia | "
            "tail -1 | cut -f1"
        ),
    )
    venv, nvidia = out.split()
    return int(venv), int(nvidia)


def build(tree: Path, image: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [str(tree / "docker" / "build.sh")],
        check=True,
        env={**os.environ, "IMAGE": image, "PROGRESS": "plain"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def rebuild_times(image: str) -> tuple[float, float]:
    """(no-change rebuild, entrypoint-only change rebuild), in a copy of the tree."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(
            REPO, tree, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", ".hypothesis")
        )
        tag = image.rsplit(":", 1)[0] + ":bench-rebuild"
        build(tree, tag)  # warm: same tree as the image, all from cache
        nochange = build(tree, tag)
        init = tree / "entrypoint" / "__init__.py"
        init.write_text(init.read_text() + f"\n# benchmark edit {time.time()}\n")
        changed = build(tree, tag)
        subprocess.run([DOCKER, "rmi", tag], capture_output=True, check=False)
    return nochange, changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=os.environ.get("IMAGE", "multinode:dev"))
    parser.add_argument("--no-gzip", action="store_true", help="skip the compressed size (minutes)")
    parser.add_argument(
        "--rebuild", action="store_true", help="time no-change and entrypoint-only rebuilds"
    )
    parser.add_argument(
        "--cold", action="store_true", help="prune the build cache and time a full build"
    )
    args = parser.parse_args()

    if args.cold:
        subprocess.run([DOCKER, "builder", "prune", "-af"], check=True, capture_output=True)
        print(
            f"cold build (empty BuildKit cache, base present): {build(REPO, args.image):7.0f} s",
            flush=True,
        )

    size = image_size(args.image)
    venv, nvidia = venv_size(args.image)
    print(f"image {args.image}")
    print(f"  uncompressed            {size / GB:6.2f} GB")
    if not args.no_gzip:
        print(f"  docker save | gzip      {gzip_size(args.image) / GB:6.2f} GB", flush=True)
    print(f"  floor: /opt/venv        {venv / GB:6.2f} GB (nvidia-* wheels {nvidia / GB:.2f} GB)")
    print(f"  above the floor         {(size - venv) / GB:6.2f} GB (goal: under 0.50)")
    print("  five largest layers:")
    for n, created_by in layers(args.image)[:5]:
        print(f"    {n / GB:6.2f} GB  {created_by[:100]}")
    if args.rebuild:
        nochange, changed = rebuild_times(args.image)
        print(f"  rebuild, nothing changed        {nochange:6.1f} s")
        print(f"  rebuild, entrypoint-only change {changed:6.1f} s (goal: under 20)")
    print("published, for scale (not measured here):")
    for name, where, figure in PUBLISHED:
        print(f"  {name}: {figure}  [{where}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
