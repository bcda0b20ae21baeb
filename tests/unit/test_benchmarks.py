"""Every benchmark that needs neither Docker nor a GPU, run at its smallest size: a change that
breaks one fails here (issue 48: control_scale.py and preflight.py had failed at their start for
weeks, and nothing ran them). No figure is asserted: the figures are the benchmarks' own, made
by hand at full size (docs/benchmarks.md). The image's benchmarks have their smoke runs in
tests/image/test_benchmarks.py; gpu_machine.sh and gpu_trainer.py need a GPU and run on the GPU
machine (docs/benchmarks.md), so here they are only parsed."""

from __future__ import annotations

import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# benchmark: (its smallest arguments, a line of its output that says it ran to the end)
SMOKE = {
    "control_flood.py": (
        ["--trials", "1", "--flooders", "1", "--hold", "20", "--timeout", "90"],
        "MEASURED flood: 1 of 1 trials joined",
    ),
    "control_scale.py": (
        ["--nodes", "8", "--steady", "2", "--workers", "1", "--scrape", "1"],
        "nodes  last hello->go",
    ),
    "control_soak.py": (["--minutes", "0.1", "--nodes", "2"], "0 false alarms"),
    "flight_recorder.py": (["--collectives", "20", "--rounds", "1"], "answering the entrypoint"),
    "fuzz_env.py": (["--cases", "200"], "slowest case"),
    "node0_seat.py": (["--nodes", "8", "--steady", "1"], "loss->all know it"),
    "node0_takeover.py": (["--nodes", "8", "--steady", "1", "--workers", "1"], "kill->last go"),
    "preflight.py": (["--nodes", "2", "--repeat", "1"], "join + check"),
    "progress_hook.py": (["--steps", "1000"], "traced memory after 1,000 more steps"),
    "startup.py": (["--runs", "1"], "entrypoint plan --json"),
}
ON_THE_IMAGE = {"image_size.py", "launch_forms.py", "pull.py", "spares.py", "start_cost.py"}
ON_A_GPU = {"gpu_trainer.py", "gpu_machine.sh"}
HELPERS = {"loopback.py"}  # imported by the benchmarks above, run by none


def test_every_benchmark_has_a_smoke_run():
    found = {p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh")}
    assert found == set(SMOKE) | ON_THE_IMAGE | ON_A_GPU | HELPERS, found


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_benchmark_runs_at_its_smallest_size(name):
    args, last = SMOKE[name]
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert last in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_the_gpu_benchmarks_parse():
    py_compile.compile(str(BENCHMARKS / "gpu_trainer.py"), doraise=True)
    proc = subprocess.run(
        ["bash", "-n", str(BENCHMARKS / "gpu_machine.sh")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
