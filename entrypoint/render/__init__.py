"""`entrypoint render`: a complete, commented job spec for one platform, from one Request.

One small module per platform, all with the same face:

    NAME = "slurm"                     # the PLATFORM argument
    SUMMARY = "..."                    # one line for `entrypoint render --help`
    DOCS = "https://..."               # where the platform documents what the spec uses
    OPTIONS = ("--time", ...)          # the options it takes beyond the common ones
    def render(request) -> str         # pure: the whole spec as text, produced in one place

Each spec sets only what the entrypoint cannot derive on the node; the platform modules under
entrypoint/plan/platforms read what it leads to (tests/unit/test_render_roundtrip.py checks that).

Owns the `Request` (`request`, its options checked in `checks`, parsed from the command line in
`options`), the quoting (`quote`, `text`) and each spec's /metrics wiring (`scrape`). Imports
`plan` only (ports, values, secrets, errors): never `control`, `supervise` or pydantic, so that
`entrypoint render` starts fast. This file imports none of the package's modules; they import it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the platform modules and request.py import this package, never the reverse
    from entrypoint.render.request import Request

# The order `entrypoint render --help` lists them in.
TARGETS: tuple[str, ...] = ("slurm", "kubernetes", "pytorchjob", "trainjob", "volcano", "docker")


def module(name: str) -> ModuleType:
    return importlib.import_module(f"entrypoint.render.{name}")


def render(request: Request) -> str:
    return module(request.platform).render(request)
