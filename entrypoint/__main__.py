"""`python -m entrypoint` and the `entrypoint` command. From its first line on, SIGINT, SIGTERM
and SIGHUP end a command quietly with 128 + N, however early they come (a command that has its
own handlers, `run` and `local`, takes over from there): the handlers are set before anything
else is imported, inside the `try` that turns them into the exit code. SIGINT is taken even
where the parent ignored it (a shell's background job): a person's Ctrl-C is never lost. An
ignored SIGHUP (nohup) stays ignored. Once the command has its exit code, a later signal
changes nothing."""

from __future__ import annotations

import atexit
import os
import signal
import sys

from entrypoint import early_signals  # the package: imported already, nothing more

TYPE_CHECKING = False  # typing is not imported before the handlers are set
if TYPE_CHECKING:
    from typing import NoReturn

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop(number: int, _frame: object) -> None:
    early_signals.append(number)  # kept, should the exception below be dropped
    raise KeyboardInterrupt(number)


class _QuietWhenDropped:
    """sys.unraisablehook: Python drops an exception raised where it cannot propagate (a weakref
    callback of importlib's module locks, a __del__) and prints "Exception ignored in ...", a
    traceback. _stop's is in early_signals already, so it goes quietly; any other goes to
    Python's own hook."""

    def __init__(self) -> None:
        self.hook = sys.unraisablehook

    def __call__(self, unraisable: "sys.UnraisableHookArgs") -> None:  # a type only in typeshed
        exc = unraisable.exc_value
        if isinstance(exc, KeyboardInterrupt) and exc.args and exc.args[0] in STOPPING:
            return
        self.hook(unraisable)


def _take_signals() -> None:
    sys.unraisablehook = _QuietWhenDropped()
    for number in STOPPING:
        if number != signal.SIGHUP or signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, _stop)


def _ending() -> None:
    for number in STOPPING:
        signal.signal(number, signal.SIG_IGN)


def main() -> int:
    try:
        _take_signals()
        from entrypoint.cli import main as cli

        code = cli()
    except Exception:
        if not early_signals:  # no signal came: the error is the command's own
            raise
        # CPython can turn the handler's KeyboardInterrupt into another error: raised while it
        # formats a failed `from X import Y`'s message (as `ssl` does at import), it becomes
        # TypeError("expected a message argument"). The signal was recorded: it is the cause.
        _quiet_exit(early_signals[0])
    except KeyboardInterrupt as interrupt:
        _quiet_exit(interrupt.args[0] if interrupt.args else None)
    _ending()
    return code


def _quiet_exit(number: object) -> NoReturn:
    """Ends the process at once with 128 + the signal's number (SIGINT's when unknown).

    CPython marks an interrupt as unhandled when it lands in code that exec() runs from a
    string (dataclasses and namedtuple build their methods so, at import), caught or not, and
    then ends the process by SIGINT at exit: the exit handlers run here, then the process ends
    with the code."""
    _ending()
    code = 128 + (number if isinstance(number, int) and 0 < number < 128 else signal.SIGINT)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
