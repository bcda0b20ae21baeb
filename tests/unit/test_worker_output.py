"""The workers' output under torchrun (--redirects=3): each worker's stdout and stderr read from
the files torchrun writes and passed on a whole line at a time, so that two workers' lines
never mix mid-line; a line left without its end is passed on after a moment, and at the end.
Real torchrun over real files (tests/unit/test_run_real.py runs whole jobs)."""

import os
import subprocess
import sys
import time
from pathlib import Path

from entrypoint.supervise.launcher_process import WorkerOutput, _log_dir

WRITER = """
import os, sys, time
r = os.environ["LOCAL_RANK"]
for i in range(20):
    sys.stdout.write(f"rank {r} begins line {i} ")
    sys.stdout.flush()
    time.sleep(0.01)
    print(f"and ends it", flush=True)
print(f"rank {r} to stderr", file=sys.stderr, flush=True)
sys.stdout.write(f"rank {r} never ends this line")
sys.stdout.flush()
"""


def test_two_workers_lines_never_mix(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        f"--log-dir={log_dir}", "--redirects=3", "--no-python", sys.executable, "-c", WRITER,
    ]  # fmt: skip
    assert _log_dir(command) == log_dir
    out: list[str] = []
    err: list[str] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTRYPOINT_")}
    process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    relay = WorkerOutput(log_dir, process, err.append, out.append)
    relay.start()
    process.wait(timeout=120)
    relay.join(timeout=10)
    for rank in (0, 1):
        lines = [line for line in out if line.startswith(f"rank {rank} ")]
        assert lines[:20] == [f"rank {rank} begins line {i} and ends it" for i in range(20)], out
        assert lines[-1] == f"rank {rank} never ends this line"
        assert f"[default{rank}]:rank {rank} to stderr" in err
    assert len(out) == 42


def test_only_torchrun_writing_to_files_is_read():
    assert _log_dir(["python", "-m", "torch.distributed.run", "--log-dir=/x", "t.py"]) is None
    assert _log_dir(["torchrun", "--log-dir=/x", "--redirects=3", "--tee=3", "t.py"]) is None
    assert _log_dir(["torchrun", "--log-dir=/x", "--redirects=3", "t.py"]) == Path("/x")


def test_a_line_without_its_end_waits_a_moment_then_goes(tmp_path):
    run = tmp_path / "logs" / "none_abc" / "attempt_0" / "0"
    run.mkdir(parents=True)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    out: list[str] = []
    relay = WorkerOutput(tmp_path / "logs", process, print, out.append)
    relay.before = set()
    relay.start()
    (run / "stdout.log").write_bytes(b"a progress bar 10%\r20%\rhalf a line")
    time.sleep(0.5)
    assert out == ["a progress bar 10%", "20%"]
    time.sleep(1.2)
    assert out[-1] == "half a line"
    process.kill()
    relay.join(timeout=5)
