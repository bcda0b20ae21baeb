"""The CLI through a real subprocess, as a platform would start it."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from entrypoint import __version__

BASE = {
    "PATH": os.environ["PATH"],
    "HOME": os.environ.get("HOME", "/tmp"),
    "ENTRYPOINT_GPUS_PER_NODE": "0",
}


def entrypoint(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *args],
        capture_output=True,
        text=True,
        env=BASE | (env or {}),
        timeout=60,
    )


def test_version():
    out = entrypoint("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"entrypoint {__version__}"


@pytest.mark.parametrize("command", [[], ["plan"], ["run"], ["settings"], ["doctor"]])
def test_help(command):
    out = entrypoint(*command, "--help")
    assert out.returncode == 0 and "usage: entrypoint" in out.stdout


def test_plan_json_for_seed_002_worker():
    env = {
        "WORLD_SIZE": "2",
        "RANK": "1",
        "MASTER_ADDR": "jo-dbxfe2k2l635222i-worker-0",
        "MASTER_PORT": "29500",
        "ENTRYPOINT_GPUS_PER_NODE": "8",
    }
    out = entrypoint("plan", "--json", "--", "python", "train.py", env=env)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert (plan["platform"], plan["nnodes"], plan["node_rank"], plan["world_size"]) == (
        "commercial",
        2,
        1,
        16,
    )
    assert plan["sources"]["gpus_per_node"] == "env ENTRYPOINT_GPUS_PER_NODE"


def test_plan_table_shows_rank_ranges():
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "worker-[0-1]",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "0",
        "SLURM_STEP_ID": "0",
        "SLURM_GPUS_ON_NODE": "8",
        "ENTRYPOINT_GPUS_PER_NODE": "8",
    }
    out = entrypoint("plan", env=env)
    assert out.returncode == 0, out.stderr
    assert "ranks 0-7 on worker-0, ranks 8-15 on worker-1" in out.stdout


@pytest.mark.parametrize(
    ("env", "start"),
    [
        (
            {"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "m"},
            "RANK='2': must be below WORLD_SIZE=2",
        ),
        (
            {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "m", "MASTER_PORT": "99999"},
            "MASTER_PORT='99999'",
        ),
        ({"NNODES": "2", "NODE_RANK": "1"}, "MASTER_ADDR=(unset): 2 nodes but no master address"),
        ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST='n[1-'"),
        ({"NNODES": "0"}, "NNODES='0': not a positive whole number"),
        ({"ENTRYPOINT_NPROC_PER_NODE": "x"}, "ENTRYPOINT_NPROC_PER_NODE='x'"),
    ],
)
def test_bad_input_one_line_exit_2_no_traceback(env, start):
    out = entrypoint("plan", env=env)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert lines[0].startswith("entrypoint: error: " + start)


def test_secrets_never_printed():
    env = {"HF_TOKEN": "hf_supersecretvalue", "MY_API_KEY": "abcd1234"}
    out = entrypoint(
        "plan", "--json", "--", "python", "t.py", "--token", "hf_supersecretvalue", env=env
    )
    assert out.returncode == 0
    assert "hf_supersecretvalue" not in out.stdout and "***" in out.stdout


def test_settings_markdown():
    out = entrypoint("settings", "--markdown")
    assert out.returncode == 0 and "`ENTRYPOINT_NPROC_PER_NODE`" in out.stdout


def test_the_run_directory_never_shadows_the_package(tmp_path):
    """The default run directory lives in /tmp; `python -m entrypoint` started there must still
    import the package, not a namespace package made of the run directory."""
    from entrypoint.plan.settings import Settings

    run_dir = Settings.model_fields["run_dir"].default
    (tmp_path / run_dir.name / "node0").mkdir(parents=True)
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=BASE | {"PYTHONPATH": ""},
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == f"entrypoint {__version__}", out.stderr


RENDER_BIG = ["render", "docker", "--nodes", "10000", "--gpus-per-node", "8", "--image", "x"]


def test_reader_gone_after_a_few_bytes_ends_quietly_with_141():
    """`entrypoint render ... | head -c 100`: as git and ls, no traceback, the shell's status
    for SIGPIPE (128 + 13). 3 MB of spec: far more than a pipe holds, so the write meets it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", *RENDER_BIG, "--master-addr", "10.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=BASE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(100).startswith(b"# train")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141
    assert err == b""


def test_reader_gone_before_the_plan_is_printed_ends_quietly_with_141():
    """`entrypoint plan | head -c 0`: the reader left before the first write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "entrypoint", "plan"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=BASE,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert out.returncode == 141
    assert out.stderr == b""


@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize("word", ["", " "])
def test_empty_program_word_refused_in_one_line(command, word):
    out = entrypoint(command, "--", word, "train.py")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == (
        f"entrypoint: error: command={word!r}: the trainer's program is an empty word. "
        "Give the trainer command after --, e.g. -- python train.py"
    )


def test_empty_program_word_refused_by_render():
    out = entrypoint(
        *RENDER_BIG[:2],
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--image",
        "x",
        "--master-addr",
        "h",
        "--",
        "",
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("entrypoint: error: CMD='': the trainer's program is an empty")


def test_the_commands_are_the_parsers():
    from entrypoint import cli

    sub = next(a for a in cli._parser()._actions if a.dest == "command")
    assert set(cli.HANDLERS) == set(sub.choices)


def test_what_runs_as_given():
    from entrypoint.cli import as_given

    assert as_given(["sh", "-c", "true"]) == shutil.which("sh")
    for argv in ([], ["run"], ["plan", "--json"], ["--help"], ["rnu"], ["no-such-program-here"]):
        assert as_given(argv) is None, argv


def test_another_program_runs_as_given_with_one_line_and_its_own_exit_code():
    """`docker run IMAGE python -c ...` (or bash): the image's ENTRYPOINT hands it over."""
    out = entrypoint("sh", "-c", "echo out; echo err >&2; exit 3")
    assert out.returncode == 3
    assert out.stdout == "out\n"
    assert out.stderr.splitlines() == [
        "entrypoint: sh is not an entrypoint command: running it as given, with no plan and no "
        "supervision (entrypoint run -- sh ... plans, checks and supervises it)",
        "err",
    ]


def test_a_misspelt_command_is_still_an_error():
    out = entrypoint("rnu")
    assert out.returncode == 2 and "invalid choice: 'rnu'" in out.stderr
