"""The package's shape (issues 14, 26 and 49): at most 15 entries at its top level, each
subpackage saying what it owns and light to import, no module over 800 lines, no function over
80 lines outside the built-in jobs' training loops (files are cut where their jobs part, not
where a count falls: these only catch a file grown past reading), no import cycle between its
modules (a package and its own modules included), and no private (`_name`) import from one
module into another. Which subpackage may import which is import-linter's contract in
pyproject.toml (`make lint`)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "entrypoint"
MAX_MODULE_LINES = 800  # 500 until issue 49: the cap shaped the code more than its jobs did
MAX_FUNCTION_LINES = 80  # 60 until issue 49
MAX_TOP_LEVEL = (
    16  # 15 rooms and modules, progress.py (the one module a trainer imports) among them
)
SUBPACKAGES = (
    "plan",
    "consensus",
    "control",
    "coordinator",
    "metrics",
    "supervise",
    "doctor",
    "local",
    "render",
    "job",
    "trainer_side",
)
# What no subpackage may load on import: `entrypoint --help` and `render` start without them,
# and the trainer's interpreter imports trainer_side and job.
HEAVY = (
    "torch",
    "jax",
    "deepspeed",
    "docker",
    "pydantic",
    "pydantic_settings",
    "prometheus_client",
    "yaml",
)

# The built-in jobs' training loops: one straight story each, read top to bottom.
TRAINING_LOOPS = {
    ("job/deepspeed_train.py", "main"),
    ("job/jax_train.py", "main"),
}


def modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(PACKAGE)): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def module_name(relative: str) -> str:
    parts = ["entrypoint", *relative.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_top_level_small():
    entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert len(entries) <= MAX_TOP_LEVEL, sorted(entries)
    assert set(SUBPACKAGES) <= entries, set(SUBPACKAGES) - entries


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_subpackage_says_what_it_owns(name):
    tree = ast.parse((PACKAGE / name / "__init__.py").read_text())
    doc = ast.get_docstring(tree) or ""
    assert "import" in doc, f"entrypoint/{name}/__init__.py: say what it owns and may import"


def test_subpackages_light_to_import():
    code = (
        "import sys\n"
        + "".join(f"import entrypoint.{name}\n" for name in SUBPACKAGES)
        + f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_modules_short():
    lengths = {name: len((PACKAGE / name).read_text().splitlines()) for name in modules() if name}
    long = {name for name, n in lengths.items() if n > MAX_MODULE_LINES}
    assert not long, {n: lengths[n] for n in long}


def test_functions_short():
    long = {}
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[(name, node.name)] = lines
    assert set(long) - TRAINING_LOOPS == set(), long
    assert TRAINING_LOOPS <= set(long), TRAINING_LOOPS - set(long)  # no stale exception


def _imports(tree: ast.Module, importer: str, known: set[str]):
    """(module imported, names taken from it) for every import of this package's modules,
    at any depth (function-level imports included), TYPE_CHECKING blocks left out."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                base = ".".join(importer.split(".")[: -node.level] + [node.module])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    yield sub, []
                elif base in known:
                    yield base, [alias.name]


def graph() -> tuple[dict[str, set[str]], list[str]]:
    trees = {module_name(name): tree for name, tree in modules().items()}
    known = set(trees)
    edges: dict[str, set[str]] = {name: set() for name in trees}
    private = []
    for name, tree in trees.items():
        for target, names in _imports(tree, name, known):
            if target != name:  # a module importing its own package counts: render/ had one
                edges[name].add(target)
            private += [
                f"{name} imports {target}.{n}"
                for n in names
                if n.startswith("_") and not n.endswith("__")
            ]
    return edges, private


def test_no_private_imports_across_modules():
    assert graph()[1] == []


def test_no_import_cycle():
    edges, _ = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(target) :] + [target]))
            if target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name)


@pytest.mark.parametrize("argv", [["--help"], ["render", "--help"], ["--version"]])
def test_the_cli_s_help_and_render_start_without_pydantic(argv):
    """`entrypoint --help` and `render` import what they run only: no pydantic, structlog,
    torch or Docker SDK (`--help` imported pydantic through plan.ports until issue 26)."""
    code = (
        "import sys, contextlib, io\n"
        "from entrypoint import cli\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        f"    cli.main({argv!r})\n"
        "print(sorted(m for m in ('pydantic', 'structlog', 'torch', 'docker') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


# What `entrypoint plan` may not load: the supervisor, the control channel, the log writer
# (structlog, rich), pydantic-settings (0.33 s of import alone in the image), metrics, Docker.
NOT_FOR_PLAN = (
    "entrypoint.supervise.supervisor",
    "entrypoint.supervise.logs",
    "entrypoint.control.control_channel",
    "entrypoint.coordinator.conductor",
    "structlog",
    "rich",
    "pydantic_settings",
    "prometheus_client",
    "docker",
    "torch",
)


def test_plan_imports_only_what_it_uses():
    """`entrypoint plan` in under 300 ms over a bare Python start (benchmarks/startup.py): the
    modules it must not import, listed."""
    code = (
        "import sys, contextlib, io\n"
        "from entrypoint import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['plan', '--json'])\n"
        f"print(sorted(m for m in {NOT_FOR_PLAN!r} if m in sys.modules))"
    )
    env = {"PATH": "/usr/bin:/bin", "ENTRYPOINT_GPUS_PER_NODE": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
