"""Run a function on a module right after its first import, without importing it: how the site
hook adapts libraries in the trainer's process only if the trainer uses them. It runs as every
Python process of the image starts (docker/entrypoint-every-process.pth), so it imports nothing
heavy: importlib.abc alone costs about 70 ms there (it loads importlib.resources, pathlib,
tempfile, inspect); sys.meta_path takes any object with find_spec."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _AfterImport:
    def __init__(self, target: str) -> None:
        self.target = target
        self.then: list[Callable[[ModuleType], None]] = []

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname != self.target:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module: ModuleType) -> None:
            run(module)
            for each in then:
                each(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def when_imported(target: str, then: Callable[[ModuleType], None]) -> None:
    """Call then(module) now if `target` is loaded, else once its module has run."""
    if target in sys.modules:
        then(sys.modules[target])
        return
    finder = next(
        (f for f in sys.meta_path if isinstance(f, _AfterImport) and f.target == target), None
    )
    if finder is None:
        finder = _AfterImport(target)
        sys.meta_path.insert(0, finder)
    if then not in finder.then:
        finder.then.append(then)
