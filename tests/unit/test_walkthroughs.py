"""docs/ARCHITECTURE.md's walk-throughs (add a platform, a launcher, a health check, a render
target, a control message) stay true: every file they name exists, and each step that a new
member or kind needs is checked here, so that a step left out fails."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from entrypoint.plan.launchers import Launcher
from entrypoint.plan.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
WALKS = {
    m[1]: m[2]
    for m in re.finditer(r"^## (Add a [^\n]+)\n(.*?)(?=^## |\Z)", ARCHITECTURE, re.M | re.S)
}
PATH = re.compile(r"`((?:[a-z_]+/)+[a-z_<>-]+\.(?:py|md|toml))`")


def test_the_walkthroughs_are_there():
    assert {"Add a platform", "Add a launcher", "Add a health check"} <= set(WALKS), set(WALKS)


@pytest.mark.parametrize("walk", sorted(WALKS))
def test_every_file_a_walkthrough_names_exists(walk):
    missing = []
    for found in PATH.findall(WALKS[walk]):
        if "<" in found:
            continue  # a pattern: test_platforms_<name>.py
        if not any((base / found).exists() for base in (ROOT, ROOT / "entrypoint")):
            missing.append(found)
    assert not missing, f"{walk}: {missing}"


@pytest.mark.parametrize("member", [m.value for m in Launcher])
def test_every_launcher_has_each_step_of_its_walkthrough(member):
    literal = typing.get_args(Settings.model_fields["launcher"].annotation)
    assert member in literal, f"plan/settings.py: {member!r} missing from the launcher Literal"
    row = next(
        line
        for line in (ROOT / "docs" / "settings.md").read_text().splitlines()
        if line.startswith("| `ENTRYPOINT_LAUNCHER`")
    )
    assert member.lower() in row.lower(), f"docs/settings.md: {member} missing from the row"
    plans = (ROOT / "tests" / "unit" / "test_plan.py").read_text()
    assert f'"{member}"' in plans, f"tests/unit/test_plan.py: no case plans with {member}"


def _health_kinds() -> set[str]:
    """Every `Event(kind, ...)` the health watch makes, an XID's as `xid_<code>`."""
    kinds = set()
    for name in ("health.py", "health_rules.py"):
        tree = ast.parse((ROOT / "entrypoint" / "supervise" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Event":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    kinds.add(first.value)
                elif isinstance(first, ast.JoinedStr):
                    kinds.add("xid_<code>")
                else:
                    kinds.update(_assigned_strings(tree))
    return kinds


def _assigned_strings(tree: ast.Module) -> set[str]:
    """A kind chosen before the call (`kind = "ib_port_down" if ... else "nic_down"`)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "kind":
            for c in ast.walk(node.value):
                if isinstance(c, ast.Constant) and re.fullmatch(r"[a-z_]+", str(c.value)):
                    found.add(str(c.value))
    return found


def test_every_health_event_kind_is_in_the_observability_page():
    page = (ROOT / "docs" / "observability.md").read_text()
    kinds = _health_kinds()
    assert {"xid_<code>", "nvlink_down", "nic_down", "ib_port_down"} <= kinds, kinds
    missing = sorted(k for k in kinds if f"`{k}`" not in page)
    assert not missing, f"docs/observability.md: health event kinds not listed: {missing}"
