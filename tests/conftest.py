"""What every test folder shares: the `image` and `cluster` marks, and how a test that needs
Docker behaves without it: outside CI it skips with the reason; under CI (CI=true) it fails,
so that a broken build can never pass as "skipped"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from profiling import register as register_profile
from schedule import FILES_FIRST, pytest_xdist_make_scheduler  # noqa: F401 - the hook

HERE = Path(__file__).parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# tests/compat: users' trainers on node containers of the image (the image mark, as `-m image`)
MARKS = {"image": pytest.mark.image, "cluster": pytest.mark.cluster, "compat": pytest.mark.image}
# The tests that mostly wait, longest first: their mean seconds per test (`make test-profile`,
# 2026-12-06, docs/testing.md). The unit tests' processes take a test at a time in this order
# (`--dist load --maxschedchunk 1`), so no long test starts last and holds the run open.
LONGEST_FIRST = {
    "unit/test_hang_real.py::test_with_no_setting_the_learned_timeout": 192,
    "unit/test_hang_real.py": 40,
    "unit/test_allreduce_real.py": 24,
    "unit/test_spares_real.py": 17,
    "unit/test_health_real.py": 15,
    "unit/test_status_real.py": 12,
    "unit/test_supervise_real.py": 9,
    "unit/test_run_real.py": 7,
    "unit/test_control_real.py": 7,
    "unit/test_benchmarks.py": 5,
    "unit/test_world_check.py": 4,
    "unit/test_exit_guard.py": 2,
    "unit/test_launch_lines.py": 1.4,
    "compat/test_compat.py": 43,  # each case goes alone (below)
}


def pytest_configure(config):
    register_profile(config)  # TEST_PROFILE=DIR: a line per test (tests/profiling.py)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if HERE in path.parents and path.relative_to(HERE).parts[0] in MARKS:
            item.add_marker(MARKS[path.relative_to(HERE).parts[0]])
    items.sort(key=lambda item: -expected_seconds(item.nodeid))  # stable: the rest keep order


def expected_seconds(nodeid: str) -> float:
    """A test's seconds, or those of its whole file where the file goes to one process."""
    table = FILES_FIRST if any(key in nodeid for key in FILES_FIRST) else LONGEST_FIRST
    return next((s for key, s in table.items() if key in nodeid), 0.0)


@pytest.fixture(scope="session")
def unavailable():
    """unavailable(why): skip, or fail under CI."""

    def say(why: str):
        if IN_CI:
            pytest.fail(
                f"{why} (CI=true: tests that need Docker must run, not skip)", pytrace=False
            )
        pytest.skip(why)

    return say
