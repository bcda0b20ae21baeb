"""A misspelt ENTRYPOINT_* variable is never silently ignored: one warning in the plan (so on
every node and in `entrypoint plan`), naming the setting it was probably meant to be;
ENTRYPOINT_STRICT=1 makes it a refusal before anything is probed."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import node
from entrypoint.job.harness import _SETTINGS as JOB_OPTIONS
from entrypoint.plan import stray_variables
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.node_plan import make_plan
from entrypoint.plan.settings import Settings

PACKAGE = Path(__file__).parents[2] / "entrypoint"


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("ENTRYPOINT_SPARE", "ENTRYPOINT_SPARES"),
        ("ENTRYPOINT_HEARTBEAT_TIMOUT", "ENTRYPOINT_HEARTBEAT_TIMEOUT"),
        ("ENTRYPOINT_MAX_RESTART", "ENTRYPOINT_MAX_RESTARTS"),
        ("ENTRYPOINT_JOB_STEP", "ENTRYPOINT_JOB_STEPS"),
    ],
)
def test_a_misspelt_setting_is_warned_about_with_the_one_meant(name, meant):
    plan = make_plan({name: "1"}, node(0), ["python", "t.py"])
    (warning,) = [w for w in plan.warnings if name in w]
    assert warning.startswith(f"{name} is not a setting") and f"Did you mean {meant}?" in warning


def test_a_name_like_nothing_gets_the_list_and_strict_refuses():
    plan = make_plan({"ENTRYPOINT_ZZZ": "1"}, node(0), ["python", "t.py"])
    assert any("ENTRYPOINT_ZZZ is not a setting" in w and "entrypoint settings" in w
               for w in plan.warnings)  # fmt: skip
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"ENTRYPOINT_STRICT": "1", "ENTRYPOINT_SPARE": "1"})
    assert "ENTRYPOINT_SPARE='1': is not a setting" in err.value.line()
    assert "Did you mean ENTRYPOINT_SPARES?" in err.value.line()


def test_settings_and_the_entrypoints_own_variables_are_not_warned_about():
    env = {name: "1" for name in stray_variables.known(Settings.model_fields)}
    assert stray_variables.unknown(env, Settings.model_fields) == []
    assert (
        stray_variables.unknown(
            {"SLURM_JOB_ID": "1", "WORLD_SIZE": "2", "PET_NNODES": "2"}, Settings.model_fields
        )
        == []
    )


def test_every_entrypoint_variable_the_code_names_is_known():
    """A variable the package reads or sets, that is not a setting, must be in OTHER_VARIABLES:
    else its users would be warned about it."""
    named = set()
    for path in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r"ENTRYPOINT_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    named |= {f"ENTRYPOINT_JOB_{name.upper()}" for name, *_ in JOB_OPTIONS}
    assert named - stray_variables.known(Settings.model_fields) == set()


def test_plan_shows_it_and_strict_exits_2_in_one_line():
    env = {"PATH": "/usr/bin:/bin", "ENTRYPOINT_GPUS_PER_NODE": "0", "ENTRYPOINT_SPARE": "1"}
    command = [sys.executable, "-m", "entrypoint", "plan"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ENTRYPOINT_SPARE is not a setting" in out.stdout + out.stderr
    strict = subprocess.run(
        command, env=env | {"ENTRYPOINT_STRICT": "1"}, capture_output=True, text=True, timeout=60
    )
    assert strict.returncode == 2 and strict.stderr.count("\n") == 1, strict.stderr
