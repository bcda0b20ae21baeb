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


def test_node_0s_mind_holds_no_callback():
    """entrypoint/coordinator: the job's state is one record and the rules are functions over it
    (a Seating that was handed the Conductor's own `end`, `failure` and `hello` is gone); a
    callback would hide state outside the record, which node 0's replacement must read whole."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}"
        for path in sorted((PACKAGE / "coordinator").glob("*.py"))
        if "Callable" in path.read_text()
    ]
    assert not found, found


def test_no_two_modules_share_a_base_name():
    """One name per family: a reader finds a module by its name alone. A platform's reader
    (plan/platforms/<name>.py) and its renderer (render/<name>.py) are a pair, and every
    package has its __init__ (and a runnable one its __main__)."""
    platforms = {p.name for p in (PACKAGE / "plan" / "platforms").glob("*.py")}
    where: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py") or "site-hook" in path.parts:
            continue
        where.setdefault(path.name, []).append(str(path.parent.relative_to(PACKAGE)))
    shared = {
        name: dirs
        for name, dirs in where.items()
        if len(dirs) > 1
        and not (name in platforms and sorted(dirs) == ["plan/platforms", "render"])
    }
    assert not shared, shared


def test_no_code_is_packed_by_hand():
    """`# fmt: skip` only on a module-level table of data (launch_lines' option sets): code is
    laid out by the formatter, not packed to fit a line cap."""
    found = []
    for path, tree in _trees():
        tables = {
            line
            for node in tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign)
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
        }
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "# fmt: skip" in line and n not in tables:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{n}")
    assert not found, found


VARIABLE_NAME = re.compile(r"[A-Z][A-Z0-9_]+")


def test_every_constant_is_defined_once():
    """No UPPER_CASE name is given the same literal value in two modules: a fact is written in
    one place and imported. Excepted: a platform's variable names (`WORLD_SIZE = "WORLD_SIZE"`,
    read by several platforms) and a platform's reader and renderer naming the same platform
    (NAME, DOCS). Two facts that share a value get two names (Volcano's PLUGIN_PORT and
    Kubeflow's PYTORCHJOB_PORT are both 23456)."""
    where: dict[tuple[str, str], list[str]] = {}
    for path, tree in _trees():
        if "site-hook" in path.parts:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            value = node.value
            if not isinstance(value, ast.Constant) or value.value is None:
                continue
            if isinstance(value.value, str) and VARIABLE_NAME.fullmatch(value.value):
                continue
            for name in names:
                if name.isupper() and name not in ("NAME", "DOCS"):
                    key = (name, repr(value.value))
                    where.setdefault(key, []).append(str(path.relative_to(PACKAGE.parent)))
    twice = {f"{name} = {value}": paths for (name, value), paths in where.items() if len(paths) > 1}
    assert not twice, twice
