"""Hostile files where a variable points (issue 15): a config directory's deepspeed.json and
config.json (ENTRYPOINT_CONFIG=<dir>) and the job's token file (ENTRYPOINT_JOB_TOKEN_FILE).
Each shape through the real CLI in a subprocess with a timeout, since some of them hung: exit 2,
one line naming the variable, the file and the fix, no traceback. Then the reader's own
limits, at their edges (entrypoint/plan/files.py)."""

import json
import os
import subprocess
import sys

import pytest

from entrypoint.plan import files
from entrypoint.plan.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = {
    "PATH": os.environ["PATH"],
    "HOME": os.environ.get("HOME", "/tmp"),
    "PYTHONPATH": REPO,
    "ENTRYPOINT_GPUS_PER_NODE": "0",
}
GOOD = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}


def _ds(**fields) -> bytes:
    return json.dumps(GOOD | fields).encode()


def _nested(depth: int) -> bytes:
    return b'{"x": ' + b"[" * depth + b"]" * depth + b"}"


# (case, what deepspeed.json is: bytes, or "fifo", "dir", "/dev/zero" for a link to it;
#  words the one line holds)
DEEPSPEED = [
    ("train_batch_size 10**30 (hung plan)", _ds(train_batch_size=10**30), "31 characters"),
    ("train_batch_size 10**14", _ds(train_batch_size=10**14), "up to 1,000,000,000"),
    ("a 402-digit number (OverflowError)", _ds(train_batch_size=10**401), "402 characters"),
    ("a number beyond 10**15", _ds(steps=10**15 + 1), "beyond the limit of 10**15"),
    ("1e999", b'{"lr": 1e999}', "holds the number 1e999"),
    ("NaN", b'{"lr": NaN}', "holds NaN, which is not JSON"),
    ("-Infinity", b'{"lr": -Infinity}', "holds -Infinity"),
    ("arrays nested 10,000 deep (RecursionError)", _nested(10_000), "deeper than 64 levels"),
    ("arrays nested 64 deep", _nested(64), "deeper than 64 levels"),
    ("over 1 MiB", b'{"x": "' + b"a" * (1 << 20) + b'"}', "larger than 1,048,576 bytes"),
    ("not UTF-8", b'{"x": "\xff"}', "is not UTF-8 text"),
    ("a named pipe (hung plan)", "fifo", "deepspeed.json is a named pipe"),
    ("a directory", "dir", "deepspeed.json is a directory"),
    ("a link to /dev/zero", "/dev/zero", "deepspeed.json is a device"),
]


def _entrypoint(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *args],
        capture_output=True,
        text=True,
        env=BASE | env,
        timeout=30,  # a named pipe or a divisor loop hung here before
    )


def _refused(out, variable, words):
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"entrypoint: error: {variable}="), lines[0]
    assert words in lines[0]


def _place(path, shape):
    if shape == "fifo":
        os.mkfifo(path)
    elif shape == "dir":
        path.mkdir()
    elif isinstance(shape, str):
        path.symlink_to(shape)
    else:
        path.write_bytes(shape)


@pytest.mark.parametrize(("case", "shape", "words"), DEEPSPEED, ids=[c[0] for c in DEEPSPEED])
def test_hostile_deepspeed_json_refused_by_plan(tmp_path, case, shape, words):
    _place(tmp_path / "deepspeed.json", shape)
    out = _entrypoint("plan", env={"ENTRYPOINT_CONFIG": str(tmp_path)})
    _refused(out, "ENTRYPOINT_CONFIG", words)
    assert str(tmp_path / "deepspeed.json") in out.stderr  # the fix names the file


@pytest.mark.parametrize("command", ["plan", "doctor"])
@pytest.mark.parametrize("name", ["deepspeed.json", "config.json"])
def test_nested_10000_deep_refused_by_plan_and_doctor(tmp_path, command, name):
    (tmp_path / "deepspeed.json").write_bytes(_ds())
    (tmp_path / name).write_bytes(_nested(10_000))
    out = _entrypoint(command, env={"ENTRYPOINT_CONFIG": str(tmp_path)})
    _refused(out, "ENTRYPOINT_CONFIG", f"{name} nests arrays or objects deeper than 64")


def test_config_json_as_named_pipe_refused(tmp_path):
    (tmp_path / "deepspeed.json").write_bytes(_ds())
    os.mkfifo(tmp_path / "config.json")
    out = _entrypoint("plan", env={"ENTRYPOINT_CONFIG": str(tmp_path)})
    _refused(out, "ENTRYPOINT_CONFIG", "config.json is a named pipe")


# (case, what the token file is, words). `run` reads it before it joins or launches anything.
TOKEN = [
    ("/dev/zero (MemoryError)", "/dev/zero", "the file is a device, not a regular file"),
    ("a named pipe (hung run)", "fifo", "the file is a named pipe"),
    ("a directory", "dir", "the file is a directory"),
    ("5 kB", b"a" * 5000, "larger than 4,096 bytes"),
    ("not UTF-8", b"\xff" * 32, "not UTF-8 text"),
    ("missing", None, "cannot be read (No such file or directory)"),
]


@pytest.mark.parametrize(("case", "shape", "words"), TOKEN, ids=[c[0] for c in TOKEN])
def test_hostile_token_file_refused_by_run(tmp_path, case, shape, words):
    path = tmp_path / "token"
    if shape is not None:
        _place(path, shape)
    env = {"ENTRYPOINT_JOB_TOKEN_FILE": str(path), "ENTRYPOINT_RUN_DIR": str(tmp_path / "run")}
    out = _entrypoint("run", "--", "true", env=env)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]  # after run's log of its plan
    assert last.startswith(f"entrypoint: error: ENTRYPOINT_JOB_TOKEN_FILE='{path}': ")
    assert words in last


# The reader's limits at their edges, in process: (case, file bytes, accepted?)
EDGES = [
    ("nested 63 deep in an object", _nested(63), True),
    ("nested 64 deep in an object", _nested(64), False),
    ("10**15", b"[1000000000000000]", True),
    ("-10**15", b"[-1000000000000000]", True),
    ("10**15 + 1", b"[1000000000000001]", False),
    ("1e15", b"[1e15]", True),
    ("1.5e15", b"[1.5e15]", False),
    ("20 characters", b"[0.000000000000000001]", True),
    ("21 characters", b"[0.0000000000000000001]", False),
    ("1 MiB", b'"' + b"a" * ((1 << 20) - 2) + b'"', True),
    ("1 MiB + 1", b'"' + b"a" * ((1 << 20) - 1) + b'"', False),
    ("an empty file", b"", False),
]


@pytest.mark.parametrize(("case", "data", "accepted"), EDGES, ids=[c[0] for c in EDGES])
def test_load_json_limits(tmp_path, case, data, accepted):
    path = tmp_path / "x.json"
    path.write_bytes(data)
    if accepted:
        assert files.load_json(path, "X", "Fix it") is not None
        return
    with pytest.raises(ConfigError) as err:
        files.load_json(path, "X", "Fix it")
    assert err.value.line().startswith(f"X='{path}': the file ")
    assert err.value.line().endswith(". Fix it")
