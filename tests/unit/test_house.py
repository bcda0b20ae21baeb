"""The package's text speaks to a newcomer: no comment or docstring sends the reader to the
project's history (an issue number, the seed documents); that history stays in git."""

from __future__ import annotations

import re
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
