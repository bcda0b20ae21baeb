"""A JAX trainer's steps, seen without a change to it: each call of a function that the
trainer's own code compiled with `jax.jit` or `jax.pmap`, made by the main thread and not from
inside another such call, is one step.

Why this signal (docs/failures.md, "How a rank's progress is seen"): a JAX training loop is a
Python loop that calls its compiled step function once a step (JAX's multi-process guide, Flax's
and Optax's examples all do), and JAX has no global hook that says a step is done, as torch's
optimizer-step hook does. Sampling the main thread's stack would see a rank move, but not count
its steps, so it would give no step times and no slow-rank line, and a rank blocked inside a
long first compilation would look as still as one asleep. Counting the dispatch costs one
Python call around the compiled function (well under a microsecond, measured by
benchmarks/progress_cost.py), nothing while the trainer does not step, and a first compilation
is never a hang: no step is counted before the first call returns.

Which compiled functions count: those whose `jax.jit`/`jax.pmap` call was made from outside any
installed package (the trainer's own files, `python -c`, a notebook), so that the compiled
helpers of JAX itself and of the libraries (jax.numpy, jax.random, Optax, Flax) do not. A loop
that calls two of its own compiled functions a step counts two steps a loop: its hangs are named
all the same; its step figures are per call.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

LIBRARIES = ("site-packages", "dist-packages", "/lib/python3")  # an installed package's file

_main = threading.main_thread().ident
_inside = False  # the main thread is inside a counted call (tracing another's body)
_started: Callable[[], None] | None = None
_step: Callable[[], None] | None = None


class Counted:
    """A compiled function (jax.jit's or jax.pmap's), whose calls from the main thread count as
    steps. Anything else (`.lower`, `.trace`, `.eval_shape`, `.clear_cache`) is the function's."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self.__wrapped__ = compiled
        functools.update_wrapper(self, compiled)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        global _inside
        if _inside or threading.get_ident() != _main:
            return self.__wrapped__(*args, **kwargs)
        _inside = True
        if _started is not None:
            _started()
        try:
            out = self.__wrapped__(*args, **kwargs)
        finally:
            _inside = False
        if _step is not None:
            _step()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """A compiled method (`@jax.jit` on a `def step(self, ...)`) binds as a function does."""
        return self if instance is None else types.MethodType(self, instance)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


def _users(depth: int = 2) -> bool:
    """Whether the call `depth` frames up was made by the trainer's own code."""
    try:
        name = sys._getframe(depth).f_code.co_filename
    except ValueError:
        return False
    return not any(marker in name for marker in LIBRARIES) and not name.startswith("<frozen")


def _counting(transform: Callable[..., Any]) -> Callable[..., Any]:
    """jax.jit or jax.pmap, whose results count their calls when the trainer's code asked."""
    if getattr(transform, "_entrypoint_steps", False):
        return transform

    def counting(*args: Any, **kwargs: Any) -> Any:
        out = transform(*args, **kwargs)
        if not _users():
            return out
        if args or "fun" in kwargs:  # jax.jit(f, ...): the compiled function
            return Counted(out) if callable(out) else out

        def decorate(function: Callable[..., Any]) -> Any:  # @jax.jit(static_argnums=...)
            return Counted(out(function))

        return decorate

    counting._entrypoint_steps = True  # type: ignore[attr-defined]
    counting.__wrapped__ = transform  # type: ignore[attr-defined]
    counting.__doc__ = getattr(transform, "__doc__", None)
    counting.__name__ = getattr(transform, "__name__", "jit")
    return counting


def on_jax(jax: types.ModuleType, started: Callable[[], None], step: Callable[[], None]) -> None:
    """Count the trainer's compiled calls as steps (right after `import jax` has run): `started`
    as a call starts (the time before it is the rank's own work, as the time before a torch
    backward is), `step` once it returns."""
    global _started, _step
    _started, _step = started, step
    for name in ("jit", "pmap"):
        if hasattr(jax, name):
            setattr(jax, name, _counting(getattr(jax, name)))
