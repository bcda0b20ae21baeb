"""The image's benchmarks at their smallest size, against the built image: a change that breaks
one fails here (the others: tests/unit/test_benchmarks.py). No figure is asserted; the figures
are made by hand at full size (docs/benchmarks.md). benchmarks/pull.py pushes and pulls the
whole image (minutes): its parts (Registry, push, Containerd) are what tests/image/test_pull.py
runs, and here its command line is parsed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .image_helpers import REPO

BENCHMARKS = REPO / "benchmarks"

SMOKE = {
    "image_size.py": (["--no-gzip"], "five largest layers"),
    "start_cost.py": (["--runs", "1"], "median: process group formed"),
    "launch_forms.py": (["--only", "torchrun --nproc-per-node=2"], "| to the first step |"),
    # one kill, 15 s after node 0's first step, the end 15 s later (timed from that step: a
    # loaded machine's slow start no longer puts the kill before the training)
    "spares.py": (["--only-goodput", "--minutes", "0.5", "--every", "15"], "goodput"),
    "pull.py": (["--help"], "--cold-only"),
}


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_image_benchmark_runs_at_its_smallest_size(name, image):
    args, shown = SMOKE[name]
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), "--image", image.tag, *args]
        if name != "pull.py"
        else [sys.executable, str(BENCHMARKS / name), *args],
        capture_output=True,
        text=True,
        timeout=420,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert shown in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
