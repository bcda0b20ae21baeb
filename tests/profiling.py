"""Where a test run's time goes: a pytest plugin that writes one JSON line per test.

Loaded by tests/conftest.py when TEST_PROFILE names a directory (`make test-profile` sets it);
every pytest process (each xdist worker too) appends to <TEST_PROFILE>/tests-<pid>.jsonl. Per test:

    wall      seconds from setup's start to teardown's end
    cpu       this process's CPU seconds, plus those of the children it reaped (a node, a
              trainer, a `docker` client: everything started from the test and waited for)
    machine   every core's busy seconds meanwhile (/proc/stat): a container's CPU, which no
              child of the test's accounts for; other tests' too, when they run beside it
    forks     processes the machine started meanwhile (/proc/stat's `processes`)
    sleep     seconds this process spent in time.sleep (polling loops, fixed waits)
    start/end the test's wall-clock window, which the report matches with container starts

`python tests/profile_report.py DIR` turns the lines into the table of docs/testing.md.
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from pathlib import Path

import pytest

TICK = os.sysconf("SC_CLK_TCK")


def _machine() -> tuple[float, int]:
    """(busy CPU seconds of every core since boot, processes forked since boot)."""
    busy, forks = 0.0, 0
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("cpu "):
                user, nice, system, _idle, _iowait, irq, softirq, steal = map(
                    int, line.split()[1:9]
                )
                busy = (user + nice + system + irq + softirq + steal) / TICK
            elif line.startswith("processes "):
                forks = int(line.split()[1])
    return busy, forks


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Profile:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.out = open(directory / f"tests-{os.getpid()}.jsonl", "a", buffering=1)
        self.slept = 0.0
        self.lock = threading.Lock()
        real_sleep = time.sleep

        def sleep(seconds: float) -> None:
            start = time.monotonic()
            try:
                real_sleep(seconds)
            finally:
                if threading.current_thread() is threading.main_thread():
                    self.slept += time.monotonic() - start

        time.sleep = sleep

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.slept = 0.0
        start, wall = time.time(), time.monotonic()
        cpu, children = time.process_time(), _children_cpu()
        busy, forks = _machine()
        yield
        busy_after, forks_after = _machine()
        row = {
            "test": item.nodeid,
            "file": item.nodeid.split("::")[0],
            "wall": round(time.monotonic() - wall, 3),
            "cpu": round(time.process_time() - cpu + _children_cpu() - children, 3),
            "machine": round(busy_after - busy, 3),
            "forks": forks_after - forks,
            "sleep": round(self.slept, 3),
            "start": round(start, 3),
            "end": round(time.time(), 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        }
        self.out.write(json.dumps(row) + "\n")


def register(config: pytest.Config) -> None:
    directory = os.environ.get("TEST_PROFILE")
    if directory and not config.pluginmanager.has_plugin("test-profile"):
        config.pluginmanager.register(Profile(Path(directory)), "test-profile")
