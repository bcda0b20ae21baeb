"""The README, the docs pages and the docs site stay in step with the code and with each other."""

import re
from pathlib import Path

import yaml

from entrypoint.plan import platforms
from entrypoint.plan.settings import Settings, markdown_table

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
SETTINGS = (DOCS / "settings.md").read_text()
PLATFORMS = (DOCS / "platforms.md").read_text()


def test_settings_table_is_current():
    assert markdown_table() in SETTINGS, (
        "regenerate docs/settings.md's table: python -m entrypoint settings --markdown"
    )


def test_every_setting_documented():
    for name in Settings.model_fields:
        assert f"ENTRYPOINT_{name.upper()}" in SETTINGS


def test_every_platform_in_the_table_in_detection_order():
    rows = [
        line.split("|")[2].strip().strip("`")
        for line in PLATFORMS.splitlines()
        if line.startswith("| ")
        and line.split("|")[1].strip().isdigit()
        and line.split("|")[2].strip().startswith("`")
    ]
    assert tuple(rows) == platforms.ORDER


def test_readme_is_a_front_door():
    lines = README.splitlines()
    assert len(lines) < 300, f"README.md has {len(lines)} lines: move reference to docs/"


def _nav_pages(nav: list) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs" and config["strict"] is True
    nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages, "list every page of docs/ in mkdocs.yml's nav, once"
    assert len(nav) == len(set(nav))


def _anchors(page: Path) -> set[str]:
    """The heading ids MkDocs (toc's slugify) and GitHub give, where both agree."""
    anchors, fence = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6} (.+)", line)):
            text = re.sub(r"[^\w\s-]", "", m[1].replace("`", "")).strip().lower()
            anchors.add(re.sub(r"[-\s]+", "-", text))
    return anchors


def test_every_readme_link_to_docs_points_at_a_page():
    links = re.findall(r"\]\((docs/[^)\s]*)\)", README)
    assert len(links) >= 10, links
    for link in links:
        path, _, anchor = link.partition("#")
        page = ROOT / path
        assert page.is_file(), f"README links to {link}: no such file"
        assert page.parent == DOCS and page.suffix == ".md", link
        if anchor:
            assert anchor in _anchors(page), f"README links to {link}: no such heading"


def test_readme_keeps_the_first_commands():
    for command in ("make demo", "make test", "make image", "make dev", "make lint", "make docs"):
        assert command in README, command


def test_readme_render_commands_are_the_checked_ones():
    """docs/render.md's examples are rendered and compared (test_render_cli.py); the README's
    `entrypoint render` lines must be among them."""
    shown = (DOCS / "render.md").read_text().replace("\\\n", " ")
    commands = re.findall(r"^entrypoint render [^\n]*", README.replace("\\\n", " "), re.M)
    assert commands
    for command in commands:
        assert command in shown, command
