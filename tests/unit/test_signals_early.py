"""SIGINT, SIGTERM and SIGHUP at any instant of `entrypoint run`'s start, from the first line of
`__main__` on (imports, settings, probes, the plan, the launch, the trainer running): a quiet
exit with 128 + N, never a traceback. SIGINT is sent to a process whose parent ignored it, as a
shell does for its background jobs (a Ctrl-C must never be lost)."""

import os
import signal
import subprocess
import sys
import time

import pytest

# Seconds after __main__'s first lines installed the handlers (seen in /proc: before that the
# interpreter is still starting, and an ignored SIGINT is dropped by the kernel).
INSTANTS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 2.0)


def handlers_installed(pid: int, timeout: float = 20) -> None:
    """Until the process catches SIGTERM (SigCgt in /proc/PID/status): __main__ has begun."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/status") as status:
                caught = next(line for line in status if line.startswith("SigCgt:"))
        except (OSError, StopIteration):
            caught = "SigCgt: 0"
        if int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.002)
    raise AssertionError("the handlers were never installed")


def start(tmp_path) -> subprocess.Popen:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "ENTRYPOINT_GPUS_PER_NODE": "0",
        "ENTRYPOINT_RUN_DIR": str(tmp_path / "run"),
        "ENTRYPOINT_GRACE_PERIOD": "5",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "run", "--", "sleep", "30"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_as_a_background_job,
    )


def _as_a_background_job() -> None:
    """SIGINT ignored, as a shell leaves it for a job it starts with `&`; SIGHUP as a terminal
    leaves it (a runner started under nohup would pass it on ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_at_any_instant_of_the_start_ends_quietly(tmp_path, number):
    for delay in INSTANTS:
        proc = start(tmp_path)
        handlers_installed(proc.pid)
        time.sleep(delay)
        proc.send_signal(number)
        try:
            out, _ = proc.communicate(timeout=40)
        finally:
            proc.kill()
        assert proc.returncode == 128 + number, (delay, out[-2000:])
        assert "Traceback" not in out, (delay, out[-2000:])


def test_under_nohup_a_sighup_stays_ignored(tmp_path):
    env = {"PATH": os.environ["PATH"], "ENTRYPOINT_GPUS_PER_NODE": "0",
           "ENTRYPOINT_RUN_DIR": str(tmp_path / "run")}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "run", "--", "sleep", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    handlers_installed(proc.pid)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=60) == 0


def test_a_signal_whose_exception_python_dropped_still_stops_the_node(tmp_path):
    """The early handler raises; where Python cannot propagate an exception (a __del__, a
    finalizer) it drops it. The signal is kept (entrypoint.early_signals) and `run` acts on it
    as on one received before the trainer started."""
    env = {"PATH": os.environ["PATH"], "ENTRYPOINT_GPUS_PER_NODE": "0",
           "ENTRYPOINT_RUN_DIR": str(tmp_path / "run")}  # fmt: skip
    dropped = (
        "import sys, signal, entrypoint.__main__ as m\n"
        "try:\n    m._stop(signal.SIGTERM, None)\nexcept KeyboardInterrupt:\n    pass\n"
        "sys.argv = ['entrypoint', 'run', '--', 'sleep', '30']\nsys.exit(m.main())\n"
    )
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", dropped], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 128 + signal.SIGTERM, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "received SIGTERM before the nodes joined: stopping" in proc.stdout + proc.stderr
    assert time.monotonic() - started < 20


def test_a_signal_in_a_finalizer_is_dropped_without_a_traceback():
    """CI (a serial run, idle cores): SIGINT 0.02 s into the start landed in a weakref callback
    of importlib's module locks; Python dropped the handler's exception and printed "Exception
    ignored in ..." with a traceback. Here the signal lands in a __del__ for certain: nothing
    printed, the signal kept for `run`, and any other dropped exception still shown."""
    code = (
        "import gc, os, signal, time, entrypoint, entrypoint.__main__ as m\n"
        "m._take_signals()\n"
        "class Finalized:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(0.5)\n"
        "Finalized()\n"
        "gc.collect()\n"
        "print('kept', entrypoint.early_signals)\n"
        "class Broken:\n"
        "    def __del__(self):\n"
        "        raise ValueError('not ours')\n"
        "Broken()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "kept [2]\n", proc.stdout + proc.stderr
    assert proc.stderr.count("Traceback") == 1 and "ValueError: not ours" in proc.stderr, (
        proc.stderr
    )


def test_a_signal_that_cpython_turned_into_another_error_still_ends_quietly():
    """CI (stop 56): SIGTERM 0.2 s into the start landed while CPython formatted the message of
    ssl's failed `from _ssl import RAND_egd`; the handler's KeyboardInterrupt came out as
    TypeError("expected a message argument"), a traceback and exit 1. Here the same CPython
    path is taken for certain: the module that `main` imports its command from has a name whose
    repr is where the signal lands."""
    code = (
        "import os, signal, sys, time, types, entrypoint.__main__ as m\n"
        "class Name(str):\n"
        "    def __repr__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(5)\n"
        "        return str.__repr__(self)\n"
        "cli = types.ModuleType('entrypoint.cli')\n"
        "cli.__name__, cli.__file__ = Name('entrypoint.cli'), '/nowhere/cli.py'\n"
        "sys.modules['entrypoint.cli'] = cli\n"
        "sys.exit(m.main())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stdout + proc.stderr
    assert proc.stdout + proc.stderr == ""


def test_an_error_with_no_signal_behind_it_still_shows():
    code = (
        "import sys, types, entrypoint.__main__ as m\n"
        "sys.modules['entrypoint.cli'] = types.ModuleType('entrypoint.cli')\n"
        "sys.exit(m.main())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "ImportError: cannot import name 'main'" in proc.stderr, (
        proc.stderr
    )
