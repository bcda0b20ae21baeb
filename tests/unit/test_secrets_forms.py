"""A secret is masked in every form output can give it: as typed, JSON-escaped (`plan --json`
writes `s\\u00ebcret` for `sëcret`), repr-escaped (a one-line error quotes its value) and as
one shell word (a printed command)."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from entrypoint.plan.secrets import MASK, mask, secret_values

SECRETS = [
    "sëcret-value",
    "tab\tand\nnewline",
    'quote"back\\slash',
    "emoji-\U0001f511-key",
    "nul\x00byte",
    "plain-ascii-secret",
    "it's-a-secret",
]


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize(
    "write",
    [
        lambda s: s,
        lambda s: json.dumps({"v": s}),
        lambda s: json.dumps({"v": s}, indent=2),
        lambda s: json.dumps(s, ensure_ascii=False),
        repr,
        lambda s: f"X={s!r}: is wrong.",
        lambda s: shlex.join(["python", "t.py", "--token", s]),
    ],
    ids=["raw", "json", "json-indent", "json-unicode", "repr", "error-line", "shell"],
)
def test_every_written_form_is_masked(secret, write):
    values = secret_values({"HF_TOKEN": secret, "NCCL_DEBUG": "INFO"})
    out = mask(write(secret), values)
    assert MASK in out
    for form in (secret, json.dumps(secret)[1:-1], repr(secret)[1:-1], shlex.quote(secret)):
        assert form not in out


def run_entrypoint(args: list[str], secrets: dict[str, str]) -> subprocess.CompletedProcess:
    """`entrypoint <args> -- python t.py <each secret>` on a CPU node with the secrets set."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "ENTRYPOINT_GPUS_PER_NODE": "0",
        **secrets,
    }
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *args, "--", "python", "t.py", *secrets.values()],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("args", [["plan", "--json"], ["plan"]])
def test_plan_never_prints_a_non_ascii_secret(args):
    secrets = {
        "HF_TOKEN": "sëcret-välue",
        "DB_PASSWORD": "pw_\u2028sep",
        "MY_API_KEY": "key_\U0001f511_x",
    }
    out = run_entrypoint(args, secrets)
    assert out.returncode == 0, out.stderr
    for secret in secrets.values():
        for form in (secret, json.dumps(secret)[1:-1], repr(secret)[1:-1]):
            assert form not in out.stdout + out.stderr
    assert MASK in out.stdout


@pytest.mark.parametrize("secret", ["true", "null", "2.50", "cpu0"])
def test_a_secret_that_is_a_json_word_leaves_plan_json_valid(secret):
    """A secret whose value is also a JSON literal, a number or part of a value: the plan's
    JSON stays parseable, the secret is masked where it stood as text, nothing else changes."""
    out = run_entrypoint(["plan", "--json"], {"HF_TOKEN": secret})
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["command"][-1] == MASK
    assert secret not in json.dumps(plan["command"])
