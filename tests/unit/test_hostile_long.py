"""Long values in a refusal (issue 15): the one line shows a value's start and its length, never
120 kB of it (entrypoint/plan/errors.py), through the real CLI."""

import os
import subprocess
import sys

import pytest

from entrypoint.plan.errors import SHOWN, ConfigError, shorten

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = {
    "PATH": os.environ["PATH"],
    "HOME": os.environ.get("HOME", "/tmp"),
    "PYTHONPATH": REPO,
    "ENTRYPOINT_GPUS_PER_NODE": "0",
}
LONG = "a" * 120_000
HOSTS = ",".join(f"n{i}" for i in range(20_000))  # 128,889 characters
SLURM = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_NODEID": "0"}

# (case, environment, the variable the line names, the length it states)
CASES = [
    ("MASTER_ADDR of 120 kB", {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": LONG}, "120,000"),
    (
        "WORLD_SIZE of 120,000 digits",
        {"WORLD_SIZE": "1" * 120_000, "RANK": "1", "MASTER_ADDR": "10.0.0.1"},
        "120,000",
    ),
    ("a host list of 20,000 hosts", SLURM | {"SLURM_JOB_NODELIST": HOSTS}, "128,889"),
    ("ENTRYPOINT_NNODES of 120 kB", {"ENTRYPOINT_NNODES": LONG}, "120,000"),
]


@pytest.mark.parametrize(("case", "env", "length"), CASES, ids=[c[0] for c in CASES])
def test_long_value_shown_as_its_start_and_length(case, env, length):
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", "plan"],
        capture_output=True,
        text=True,
        env=BASE | env,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert len(line) < 600, line[:600]
    assert f"…' ({length} characters)" in line


def test_shorten():
    assert shorten("a" * SHOWN) == repr("a" * SHOWN)
    assert shorten("a" * 120_000) == "'" + "a" * SHOWN + "…' (120,000 characters)"
    assert shorten("it's" * 100).endswith('…" (400 characters)')
    line = ConfigError("X", "\x00" * 10_000, "is wrong", "Fix it").line()
    assert len(line) < 600 and line.endswith("(10,000 characters): is wrong. Fix it")


def test_long_field_of_a_config_directory_shown_as_its_start_and_length(tmp_path):
    (tmp_path / "deepspeed.json").write_text("{}")
    (tmp_path / "config.json").write_text('{"device": "' + LONG + '"}')
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", "plan"],
        capture_output=True,
        text=True,
        env=BASE | {"ENTRYPOINT_CONFIG": str(tmp_path)},
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert len(line) < 600 and "config.json: device='aaa" in line
    assert "… (120,002 characters) is not cuda or cpu" in line
