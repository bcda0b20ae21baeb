"""A config directory (ENTRYPOINT_CONFIG) is checked as a whole before anything starts: one
line naming the file, the field and the fix, exit 2, no traceback."""

import json
import subprocess
import sys

import pytest

from entrypoint.plan import configs
from entrypoint.plan.errors import ConfigError

GOOD_DS = {
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": "auto",
}

# (config.json text or None, deepspeed.json text or None, words the line must hold)
BAD = [
    (None, None, "deepspeed.json cannot be read"),
    (None, '{"train_batch_size": 32,', "deepspeed.json is not valid JSON"),
    (None, "[1, 2]", "deepspeed.json holds a JSON list, not an object"),
    (
        None,
        '{"train_micro_batch_size_per_gpu": 0}',
        "train_micro_batch_size_per_gpu=0 is not a positive whole number",
    ),
    (None, '{"train_batch_size": -8}', "train_batch_size=-8 is not a positive whole number"),
    (None, '{"train_batch_size": "16"}', "train_batch_size='16' is not a positive"),
    (None, '{"gradient_accumulation_steps": true}', "gradient_accumulation_steps=True is not"),
    ('{"device": "tpu"}', json.dumps(GOOD_DS), "config.json: device='tpu' is not cuda or cpu"),
    ('{"world_size": 0}', json.dumps(GOOD_DS), "config.json: world_size=0 is not a positive"),
    ('{"accelerate": []}', json.dumps(GOOD_DS), "config.json: accelerate=[] is not an object"),
    ("{", json.dumps(GOOD_DS), "config.json is not valid JSON"),
    ("\xff", json.dumps(GOOD_DS), "config.json"),
]


def _write(tmp_path, meta, ds):
    if meta is not None:
        (tmp_path / "config.json").write_text(meta, encoding="latin-1")
    if ds is not None:
        (tmp_path / "deepspeed.json").write_text(ds)
    return tmp_path


@pytest.mark.parametrize("meta,ds,words", BAD)
def test_a_bad_config_directory_is_one_line(tmp_path, meta, ds, words):
    with pytest.raises(ConfigError) as err:
        configs.load(_write(tmp_path, meta, ds))
    line = err.value.line()
    assert err.value.variable == "ENTRYPOINT_CONFIG" and words in line and "\n" not in line


def test_a_file_is_not_a_config_directory(tmp_path):
    (tmp_path / "x").write_text("{}")
    with pytest.raises(ConfigError, match="is not a directory"):
        configs.select(str(tmp_path / "x"), device="cpu", world_size=1)


def test_every_shipped_config_is_valid():
    assert {"cpu", "1gpu", "8gpu", "16gpu"} <= configs.shipped().keys()


@pytest.mark.parametrize("command", ["plan", "doctor"])
def test_the_cli_refuses_a_truncated_config_with_exit_2(tmp_path, command):
    _write(tmp_path, None, '{"train_batch_size": ')
    env = {"PATH": "/usr/bin:/bin", "ENTRYPOINT_CONFIG": str(tmp_path), "ENTRYPOINT_DEVICE": "cpu"}
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "deepspeed.json is not valid JSON" in out.stderr
