"""The container and cluster tests cannot pass as "skipped" under CI: they never skip by
themselves, only through tests/conftest.py's `unavailable`, which fails when CI=true (and
.ci/run refuses a report with any skipped test)."""

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
DOCKER_SUITES = ("image", "cluster", "compat")
SKIPS = re.compile(r"pytest\.skip\b|skipif|mark\.skip\b|importorskip|pytest\.xfail|mark\.xfail")


@pytest.mark.parametrize("suite", DOCKER_SUITES)
def test_docker_suites_skip_only_through_unavailable(suite):
    files = sorted((TESTS / suite).rglob("*.py"))
    assert files, suite
    found = [
        f"{path.relative_to(TESTS)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SKIPS.search(line)
    ]
    assert not found, found


# The two that may skip outside CI, each failing first when CI=true: conftest's `unavailable`
# and go-yaml's reader (tests/unit/goyaml.py, the render tests).
SKIP_HELPERS = ("conftest.py", "unit/goyaml.py")


def test_every_other_test_skips_only_through_unavailable():
    """The real-process tests in tests/unit too (two nodes over IPv6 loopback, ...)."""
    found = [
        f"{path.relative_to(TESTS)}:{number}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        if str(path.relative_to(TESTS)) not in SKIP_HELPERS and path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SKIPS.search(line)
    ]
    assert not found, found


def test_unavailable_fails_under_ci_and_skips_outside(unavailable, monkeypatch):
    monkeypatch.setitem(unavailable.__globals__, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        unavailable("no Docker engine answers")
    monkeypatch.setitem(unavailable.__globals__, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception):
        unavailable("no Docker engine answers")
