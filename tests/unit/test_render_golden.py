"""Every rendered spec against its golden file in tests/golden/render.

After an intended change: `make golden` (UPDATE_GOLDEN=1 pytest tests/unit/test_render_golden.py)
rewrites them; review the diff before committing it.
"""

import os

import pytest
from render_cases import GOLDEN, GOLDEN_DIR, rendered

UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_matches_golden(case):
    text = rendered(case)
    path = GOLDEN_DIR / case
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run make golden"
    assert text == path.read_text(), f"{case} differs from {path}: run make golden if intended"


def test_no_stale_golden_files():
    if UPDATE:
        for path in GOLDEN_DIR.iterdir():
            if path.name not in GOLDEN:
                path.unlink()
    assert sorted(p.name for p in GOLDEN_DIR.iterdir()) == sorted(GOLDEN)
