"""`entrypoint render` through a real subprocess, as a user types it."""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from render_cases import GOLDEN, GOLDEN_DIR

from entrypoint.render import TARGETS

BASE = ["--nodes", "2", "--gpus-per-node", "8", "--image", "ghcr.io/example/multinode:1.0"]


def entrypoint(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def _argv(platform: str, options: dict) -> list[str]:
    """The command line for a golden case (tests/unit/render_cases.py)."""
    argv = [platform]
    for key, value in options.items():
        if key == "trainer":
            continue
        for item in value if isinstance(value, list) else [value]:
            argv += [f"--{key.replace('_', '-')}", item]
    return argv + options.get("trainer", [])


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_stdout_is_the_golden_spec(case):
    out = entrypoint("render", *_argv(*GOLDEN[case]))
    assert out.returncode == 0, out.stderr
    assert out.stdout == (GOLDEN_DIR / case).read_text()


def test_output_file(tmp_path):
    target = tmp_path / "job.yaml"
    out = entrypoint("render", "kubernetes", *BASE, "-o", str(target), "--", "python", "t.py")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and f"wrote {target}" in out.stderr
    service, job = yaml.safe_load_all(target.read_text())
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["run", "--", "python", "t.py"]


def test_trainer_arguments_that_look_like_options_stay_the_trainers():
    out = entrypoint(
        "render",
        "docker",
        *BASE,
        "--master-addr",
        "m",
        "--",
        "python",
        "-m",
        "pkg",
        "--nodes",
        "3",
        "--image",
        "x",
    )
    assert out.returncode == 0, out.stderr
    assert "multinode:1.0 run -- python -m pkg --nodes 3 --image x" in out.stdout


@pytest.mark.parametrize("command", [["render"], *(["render", p] for p in TARGETS)])
def test_help(command):
    out = entrypoint(*command, "--help")
    assert out.returncode == 0 and "usage: entrypoint render" in out.stdout


def test_render_help_lists_every_platform_and_option():
    out = entrypoint("render", "--help").stdout
    for word in (
        *TARGETS,
        "--nodes",
        "--gpus-per-node",
        "--image",
        "--name",
        "--env",
        "--output",
        "--master-port",
        "--runtime",
        "--time",
        "--partition",
        "--account",
        "--namespace",
        "--secret-name",
        "--master-addr",
        "-- CMD ARGS",
    ):
        assert word in out


def test_listed_in_entrypoint_help():
    assert "render" in entrypoint("--help").stdout


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (
            ["slurm", "--nodes", "0", "--gpus-per-node", "8", "--image", "i"],
            "--nodes='0': not a whole number from 1 to 10000",
        ),
        (
            ["kubernetes", "--nodes", "2", "--gpus-per-node", "eight", "--image", "i"],
            "--gpus-per-node='eight': not a whole number",
        ),
        (["volcano", "--nodes", "2", "--gpus-per-node", "8"], "--image=(unset): is required"),
        (["slurm", *BASE, "--runtime", "docker"], "--runtime='docker': is not a runtime"),
        (["slurm", *BASE, "--time", "2 hours"], "--time='2 hours': is not a SLURM time limit"),
        (
            ["docker", *BASE],
            "--master-addr=(unset): machines started by hand need node 0's address",
        ),
        (["kubernetes", *BASE, "--name", "My_Job"], "--name='My_Job': is not a lower-case name"),
        (
            ["kubernetes", *BASE, "--master-port", "70000"],
            "--master-port='70000': not a whole number from 1 to 65534",
        ),
        (["pytorchjob", *BASE, "--env", "NCCL_DEBUG"], "--env='NCCL_DEBUG': has no value"),
        (
            ["pytorchjob", *BASE, "--env", "MASTER_ADDR=x"],
            ("--env='MASTER_ADDR=x': the rendered spec or the platform sets MASTER_ADDR"),
        ),
        (
            ["trainjob", *BASE, "--env", "HF_TOKEN=hf_abc", "--env", "HF_TOKEN=hf_abc"],
            "--env='HF_TOKEN=***': HF_TOKEN is given twice",
        ),
        (["kubernetes", *BASE, "python", "train.py"], "CMD='python train.py': comes without --"),
        (
            ["kubernetes", *BASE, "-o", "/nonexistent/dir/job.yaml"],
            "--output='/nonexistent/dir/job.yaml': cannot be written",
        ),
    ],
)
def test_bad_input_one_line_exit_2_no_traceback(args, start):
    out = entrypoint("render", *args)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"entrypoint: error: {start}"), out.stderr
    assert "Traceback" not in out.stderr and "hf_abc" not in out.stderr


def test_option_of_another_platform_is_refused():
    out = entrypoint("render", "trainjob", *BASE, "--master-port", "29400")
    assert out.returncode == 2 and "unrecognized arguments: --master-port" in out.stderr


def _docs_examples() -> list[tuple[list[str], list[str]]]:
    """(the render command's arguments, the lines shown as its output) from docs/render.md."""
    page = (Path(__file__).parents[2] / "docs" / "render.md").read_text()
    blocks = [block.split("\n", 1)[1] for block in page.split("```")[1::2]]
    examples = []
    for command, shown in zip(blocks[::2], blocks[1::2], strict=True):
        words = shlex.split(command.replace("\\\n", " "))
        for stop in (">", "|", "&&"):
            words = words[: words.index(stop)] if stop in words else words
        assert words[:2] == ["entrypoint", "render"], command
        examples.append((words[2:], [line for line in shown.splitlines() if line.strip()]))
    return examples


def test_docs_show_every_platform():
    assert sorted({args[0] for args, _ in _docs_examples()}) == sorted(TARGETS)


@pytest.mark.parametrize(("args", "shown"), _docs_examples(), ids=lambda x: str(x[0])[:12])
def test_docs_output_is_what_render_writes(args, shown, capsys):
    from entrypoint.cli import main

    assert main(["render", *args]) == 0
    lines = iter(capsys.readouterr().out.splitlines())
    for line in shown:  # in order, each one a whole line of the output
        assert any(line == out for out in lines), f"docs/render.md line not in the output: {line!r}"
