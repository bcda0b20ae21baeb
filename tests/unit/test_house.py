"""The package speaks to a newcomer: no comment or docstring sends the reader to the project's
history (an issue number, the seed documents; that history stays in git), no two classes share a
name, the control channel carries typed messages only, and mypy checks every function."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "entrypoint"
HISTORY = re.compile(r"\b(issue|seed)s? #?\d+|\bseeds?/|\(issue\b", re.IGNORECASE)


def test_no_comment_cites_an_issue_or_a_seed():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "\n".join(found)


def _trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text())) for p in sorted(PACKAGE.rglob("*.py"))]


def test_no_two_classes_of_the_package_share_a_name():
    where: dict[str, list[str]] = {}
    for path, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(PACKAGE.parent)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, shared


def test_nothing_sends_a_dict_literal_on_the_control_channel():
    """Every message is built as its typed class (entrypoint.control.messages)."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "send"
        and any(isinstance(arg, ast.Dict) for arg in node.args)
    ]
    assert not found, found


def test_mypy_checks_every_function_and_every_parameter_is_annotated():
    mypy = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["mypy"]
    for flag in ("check_untyped_defs", "disallow_untyped_defs", "disallow_incomplete_defs"):
        assert mypy.get(flag) is True, flag
