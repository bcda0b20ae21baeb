"""The README and `make help` stay in step with the code."""

from pathlib import Path

from entrypoint.plan import platforms
from entrypoint.plan.settings import Settings, markdown_table

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()


def test_settings_table_is_current():
    assert markdown_table() in README, "regenerate it: python -m entrypoint settings --markdown"


def test_every_setting_documented():
    for name in Settings.model_fields:
        assert f"ENTRYPOINT_{name.upper()}" in README


def test_every_platform_in_the_table_in_detection_order():
    rows = [
        line.split("|")[2].strip().strip("`")
        for line in README.splitlines()
        if line.startswith("| ")
        and line.split("|")[1].strip().isdigit()
        and line.split("|")[2].strip().startswith("`")
    ]
    assert tuple(rows) == platforms.ORDER
