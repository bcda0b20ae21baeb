"""Every platform module is in the detection order and has the Platform face; the type
checker holds each to the Protocol (entrypoint/plan/platforms/__init__.py), this test to the file
list, so a new platform cannot be written and forgotten."""

import importlib
from pathlib import Path

import pytest

from entrypoint.plan import platforms

HERE = Path(platforms.__file__).parent


def test_every_platform_file_is_in_the_order():
    files = {p.stem for p in HERE.glob("*.py")} - {"__init__", "base"}
    assert files == set(platforms.ORDER)
    assert platforms.ORDER[-1] == "local"  # the fallback that always matches


def test_every_platform_names_its_documentation():
    for platform in platforms.PLATFORMS:
        assert platform.DOCS.startswith("https://"), platform.NAME
        assert platforms.module(platform.NAME) is platform


@pytest.mark.parametrize("name", platforms.ORDER)
def test_every_platform_has_its_table_of_cases_and_its_examples_detect_as_it(name):
    """Adding a platform is one module and one table of test cases (test_platforms_<name>.py),
    whose EXAMPLES hostile_env.py fuzzes: each detects as the platform, and names its job as
    the platform's own `job_identity` says (a string, "" for none)."""
    table = importlib.import_module(f"test_platforms_{name}")
    assert table.EXAMPLES, f"tests/unit/test_platforms_{name}.py: give EXAMPLES"
    for convention, env in table.EXAMPLES.items():
        found, _why = platforms.detect(env)
        assert found.NAME == name, (convention, found.NAME)
        assert isinstance(platforms.module(name).job_identity(env), str)
