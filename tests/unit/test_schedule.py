"""tests/schedule.py, the way `make test` deals the container tests to its processes, through a
real pytest-xdist run of a small tree of tests that each say which process ran them: a file's
tests stay together, the users' trainers' cases go apart. (xdist's own `loadgroup` had fallen
back to a test at a time under pytest 9 with nothing saying so: test_local.py's runs then met
each other's containers.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from schedule import work_unit

HERE = Path(__file__).parents[1]

CASE = """
import os, time

import pytest


@pytest.mark.parametrize("n", range({n}))
def test_case(n):
    time.sleep(0.3)
    with open(os.environ["SEEN"], "a") as f:
        f.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {{__name__}} {{n}}\\n")
"""


def test_a_file_is_one_unit_and_a_users_trainer_case_is_its_own():
    assert work_unit("tests/cluster/test_local.py::test_ctrl_c") == "tests/cluster/test_local.py"
    assert (
        work_unit("tests/cluster/test_ipv6.py::test_x[bracketed]") == "tests/cluster/test_ipv6.py"
    )
    case = "tests/compat/test_compat.py::test_users_trainer_runs_unmodified[ddp-slurm]"
    assert work_unit(case) == case


def test_a_real_run_keeps_each_file_on_one_process_and_spreads_the_cases(tmp_path):
    (tmp_path / "compat").mkdir()
    (tmp_path / "compat" / "test_compat.py").write_text(CASE.format(n=4))
    (tmp_path / "zz").mkdir()
    (tmp_path / "zz" / "test_file.py").write_text(CASE.format(n=4))
    (tmp_path / "conftest.py").write_text(
        "from schedule import pytest_xdist_make_scheduler  # noqa: F401\n"
    )
    seen = tmp_path / "seen"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "--no-loadscope-reorder",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(HERE), "SEEN": str(seen)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ran = [line.split() for line in seen.read_text().splitlines()]
    assert len(ran) == 8, ran
    file_workers = {w for w, module, _ in ran if module.endswith("test_file")}
    case_workers = {w for w, module, _ in ran if module.endswith("test_compat")}
    assert len(file_workers) == 1, ran  # a file's tests together, as --dist loadfile does
    assert len(case_workers) == 2, ran  # the cases on both processes
