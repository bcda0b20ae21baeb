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
benchmarks/progress_hook.py), nothing while the trainer does not step, and a first compilation
is never a hang: no step is counted before the first call returns.

A JAX process's own work a step (what the slow-rank line compares, as it compares a torch rank's
time before backward): JAX dispatches asynchronously, so a process that waits for a slower peer
may wait inside its step call, in its next eager operation (`jax.random.split`) or where it reads
a result (`float(loss)`). A thread started with the first step samples the main thread's
innermost Python frame every SAMPLE_EVERY seconds: a sample outside JAX's own files (the
trainer's code, its data pipeline, `time.sleep`) is the process's own work, one inside them is a
wait (or a dispatch, or a compilation). The own-work seconds are reported per step. The samples
cost 0.4% of a core while the process steps (measured on this machine: a process stepping every
0.1 s, its CPU time with the sampler against without; 1.6% at one sample every 10 ms), and the
thread sleeps while nothing steps.

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
import time
import types
from collections.abc import Callable
from typing import Any

LIBRARIES = ("site-packages", "dist-packages", "/lib/python3")  # an installed package's file
JAX_FILES = ("/jax/", "/jaxlib/", "/entrypoint/trainer_side/jax_steps.py")
SAMPLE_EVERY = 0.05  # seconds between two samples of the main thread
IDLE_AFTER = 60.0  # seconds without a step after which the sampler waits for the next one

_main = threading.main_thread().ident
_inside = False  # the main thread is inside a counted call (tracing another's body)
_step: Callable[[float], None] | None = None  # called with the own work since the last step


class Sampler:
    """The thread that tells the main thread's own work from its waits in JAX."""

    def __init__(self, main: int) -> None:
        self.main = main
        self.own = 0.0  # seconds of own work since the last take()
        self.stepped = threading.Event()
        self.stepped.set()  # made at the first step: sample from now on
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="entrypoint-jax-own", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            self.stepped.wait()  # nothing stepping: no samples until the next step
            self.stepped.clear()
            last = quiet_since = time.monotonic()
            while last - quiet_since < IDLE_AFTER:
                time.sleep(SAMPLE_EVERY)
                now = time.monotonic()
                if self.stepped.is_set():
                    self.stepped.clear()
                    quiet_since = now
                frame = sys._current_frames().get(self.main)
                if frame is None:
                    return  # the main thread is gone: the process is ending
                if not any(marker in frame.f_code.co_filename for marker in JAX_FILES):
                    with self.lock:
                        self.own += now - last
                del frame
                last = now

    def take(self) -> float:
        """The own work since the last take (a step's), and the thread told a step was made."""
        with self.lock:
            own, self.own = self.own, 0.0
        self.stepped.set()
        return own


_sampler: Sampler | None = None


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
        try:
            out = self.__wrapped__(*args, **kwargs)
        finally:
            _inside = False
        if _step is not None:
            _stepped(_step)
        return out

    def __getattr__(self, name: str) -> Any:
        if name == "__wrapped__":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.__wrapped__, name)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """A compiled method (`@jax.jit` on a `def step(self, ...)`) binds as a function does."""
        return self if instance is None else types.MethodType(self, instance)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


def _stepped(step: Callable[[float], None]) -> None:
    global _sampler
    if _sampler is None:
        _sampler = Sampler(_main or 0)
        step(-1.0)  # the first step: no own work measured before it
        return
    step(_sampler.take())


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


def on_jax(jax: types.ModuleType, step: Callable[[float], None]) -> None:
    """Count the trainer's compiled calls as steps (right after `import jax` has run): `step` is
    called once a call returns, with the process's own work since the last one (seconds; -1 on
    the first)."""
    global _step
    _step = step
    for name in ("jit", "pmap"):
        if hasattr(jax, name):
            setattr(jax, name, _counting(getattr(jax, name)))
