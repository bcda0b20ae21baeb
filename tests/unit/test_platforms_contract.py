"""Every platform module is in the detection order and has the Platform face; the type
checker holds each to the Protocol (entrypoint/plan/platforms/__init__.py), this test to the file
list, so a new platform cannot be written and forgotten."""

from pathlib import Path

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
