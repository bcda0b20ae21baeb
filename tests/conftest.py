"""What every test folder shares: the `image` and `cluster` marks, and how a test that needs
Docker behaves without it: outside CI it skips with the reason; under CI (CI=true) it fails,
so that a broken build can never pass as "skipped"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from profiling import register as register_profile
from schedule import expected_seconds, pytest_xdist_make_scheduler  # noqa: F401 - the hook

HERE = Path(__file__).parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# tests/compat: users' trainers on node containers of the image (the image mark, as `-m image`)
MARKS = {"image": pytest.mark.image, "cluster": pytest.mark.cluster, "compat": pytest.mark.image}


def pytest_configure(config):
    register_profile(config)  # TEST_PROFILE=DIR: a line per test (tests/profiling.py)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if HERE in path.parents and path.relative_to(HERE).parts[0] in MARKS:
            item.add_marker(MARKS[path.relative_to(HERE).parts[0]])
    items.sort(key=lambda item: -expected_seconds(item.nodeid))  # stable: the rest keep order


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
