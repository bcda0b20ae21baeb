"""`entrypoint render` under hostile input (issues 13 and 15): whatever an argument or an --env
value holds, the job runs exactly that, and nothing else.

- Manifests are read back with kubectl's reader, go-yaml v2 (tests/unit/goyaml.py): each gives
  exactly its objects, every argument and value comes back as the same string (PyYAML agrees).
- Scripts pass `bash -n` and run with stand-ins for srun and docker on PATH that record their
  argv and environment: the trainer gets exactly the given arguments, nothing else runs.
- Every option is checked where it is given: one line naming it, its value and the fix, exit 2.

The named cases are tables; hypothesis adds generated ones, bounded in time.
"""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import goyaml
from entrypoint.cli import main
from entrypoint.plan import values
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.secrets import is_secret
from entrypoint.render import render
from entrypoint.render.request import build

IMAGE = "ghcr.io/example/multinode:1.0"
MANIFESTS = ("kubernetes", "pytorchjob", "trainjob", "volcano")
SCRIPTS = ("slurm-pyxis", "slurm-apptainer", "slurm-none", "docker")

# Plain, YAML 1.1 (go-yaml v2) reads these as numbers, booleans, nulls, dates or structure.
YAML_LOOKALIKES = [
    "1e-4",
    "y",
    "Y",
    "n",
    "N",
    "yes",
    "no",
    "No",
    "on",
    "off",
    "OFF",
    "true",
    "False",
    "0x1F",
    "012",
    "0o17",
    "0b101",
    ".inf",
    "-.Inf",
    ".NaN",
    "~",
    "null",
    "NULL",
    "",
    "1_000",
    "1:20",
    "190:20:30.15",
    "2001-12-14",
    "2001-12-14t21:59:43.10-05:00",
    "3",
    "-1",
    "+1",
    "1.5",
    "=",
    "<<",
    "- x",
    "? x",
    "a: b",
    "a #b",
    "#c",
    "[1]",
    "{a: 1}",
    "&a",
    "*a",
    "!!str",
    "%TAG",
    "@x",
    "`x",
    "|",
    ">",
    "'",
    '"',
    "\\",
    " lead",
    "trail ",
    "--flag",
    "---",
    "...",
]
# Values that end a line, a comment or a document, or run something, when written as they are.
BREAKERS = [
    "x\ntouch PWNED #",
    "import sys\nprint(sys.argv)",
    "a\r\nb",
    "tab\there",
    "nel\x85x",
    "ls\u2028x",
    "ps\u2029x",
    "bom\ufeffx",
    "\x1b[31mred",
    "del\x7f",
    "nbsp\u00a0x",
    "x\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: pwned\n",
    "$(touch PWNED)",
    "`touch PWNED`",
    "'; touch PWNED; '",
    '"; touch PWNED; "',
    "${HOME}",
    "$HOME",
    "ë",
    "日本語",
    "\U0001f511",
    "\U000e0041",
    "\ue000",
    "\\n",
    "$'\\n'",
]
NAMED = YAML_LOOKALIKES + BREAKERS


def _request(target: str, command, env, nodes: int = 2, gpus: int = 8):
    platform, _, runtime = target.partition("-")
    return build(
        platform,
        nodes=str(nodes),
        gpus_per_node=str(gpus),
        image=IMAGE,
        trainer=["--", *command] if command else [],
        master_addr="10.0.0.1" if platform == "docker" else None,
        runtime=runtime or None,
        env=[*(f"{key}={value}" for key, value in env.items()), "HF_TOKEN"],
    )


def _plain_twin(target: str, command, env, **shape) -> str:
    """The same request with every value replaced by `a`: what the line structure must be."""
    return render(_request(target, ["a"] * len(command), dict.fromkeys(env, "a"), **shape))


# ---------------------------------------------------------------------------------------------
# Manifests, read with go-yaml v2


@pytest.fixture(scope="module")
def yamlread(tmp_path_factory):
    return goyaml.build(tmp_path_factory.mktemp("goyaml"))


def _containers(document: dict) -> list[dict]:
    """Every container (TrainJob: its trainer) that runs the entrypoint, found anywhere."""
    found = []

    def walk(value):
        if isinstance(value, dict):
            if "args" in value and "image" in value:
                found.append(value)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(document)
    return found


KINDS = {
    "kubernetes": ["Service", "Job"],
    "pytorchjob": ["PyTorchJob"],
    "trainjob": ["TrainJob"],
    "volcano": ["Job"],
}


def check_manifests(binary: Path, directory: Path, command: list[str], env: dict[str, str]):
    """Render every manifest platform; go-yaml v2 reads exactly the objects, args and values."""
    paths, texts = [], []
    for platform in MANIFESTS:
        text = render(_request(platform, command, env))
        assert text.count("\n") == _plain_twin(platform, command, env).count("\n")
        path = directory / f"{platform}.yaml"
        path.write_text(text)
        paths.append(path)
        texts.append(text)
    for platform, text, documents in zip(
        MANIFESTS, texts, goyaml.read(binary, *paths), strict=True
    ):
        assert [doc.get("kind") for doc in documents] == KINDS[platform]
        assert documents == goyaml.typed(list(yaml.safe_load_all(text)))  # both readers agree
        containers = _containers(documents[-1])
        assert containers, platform
        for container in containers:
            assert container["image"] == IMAGE
            assert container["args"] == (["run", "--", *command] if command else ["run"])
            values = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert {key: values[key] for key in env} == env
            assert values["HF_TOKEN"] is None  # from the Secret


def test_the_issues_command_line_reads_back_as_strings(yamlread, tmp_path):
    """`render kubernetes ... -- python train.py --lr 1e-4 --flag y`, as typed (issue 13)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "entrypoint",
            "render",
            "kubernetes",
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--image",
            IMAGE,
            "--",
            "python",
            "train.py",
            "--lr",
            "1e-4",
            "--flag",
            "y",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    (tmp_path / "job.yaml").write_text(out.stdout)
    ((_service, job),) = goyaml.read(yamlread, tmp_path / "job.yaml")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["run", "--", "python", "train.py", "--lr", "1e-4", "--flag", "y"]


@pytest.mark.parametrize("values", [YAML_LOOKALIKES, BREAKERS], ids=["lookalikes", "breakers"])
def test_named_values_read_back_exactly(yamlread, tmp_path, values):
    env = {f"V{i}": value for i, value in enumerate(values)}
    check_manifests(yamlread, tmp_path, ["python", "train.py", *values], env)


def test_a_newline_cannot_add_an_object(yamlread, tmp_path):
    """Issue 15: a newline-bearing argument added a ConfigMap to the Kubernetes YAML."""
    payload = "x\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: pwned\n"
    check_manifests(yamlread, tmp_path, ["python", "-c", payload], {"NOTE": payload})
    text = render(_request("kubernetes", ["python", "-c", payload], {"NOTE": payload}))
    lines = text.splitlines()
    assert "kind: ConfigMap" not in lines and lines.count("---") == 1


# ---------------------------------------------------------------------------------------------
# Scripts, run with stand-ins

STANDINS = {
    # Record the argv (NUL-separated) and the environment each call was given.
    "srun": '#!/bin/bash\nprintf "%s\\0" "$@" > "$STANDIN_DIR/srun.argv"\n'
    'env -0 > "$STANDIN_DIR/srun.env"\n',
    "docker": '#!/bin/bash\ni=$(ls "$STANDIN_DIR" | grep -c "^docker\\.")\n'
    'printf "%s\\0" "$@" > "$STANDIN_DIR/docker.$i"\n',
}
RUNNERS = {
    # Run what they were given: srun's options dropped, docker's options turned into variables.
    "srun": "#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n"
    '[[ $1 == apptainer ]] && shift 4\nexec "$@"\n',
    "docker": '#!/bin/bash\nshift\nwhile [ $# -gt 0 ]; do case "$1" in\n'
    "  --rm) shift ;;\n  --name|--gpus|--network|--ipc|--ulimit) shift 2 ;;\n"
    '  -e) export "$2"; shift 2 ;;\n  *) break ;;\nesac; done\nshift\n'
    'exec entrypoint "$@"\n',
    "entrypoint": '#!/bin/bash\n[[ $1 == run ]] && shift\n[[ $1 == -- ]] && shift\nexec "$@"\n',
}


def _install(directory: Path, scripts: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        path = directory / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return directory


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    root = tmp_path_factory.mktemp("standins")
    return {"record": _install(root / "record", STANDINS), "run": _install(root / "run", RUNNERS)}


def run_script(text: str, bin_dir: Path, workdir: Path) -> subprocess.CompletedProcess:
    """bash -n, then bash in the C locale (the quoting does not depend on it), in workdir."""
    script = workdir / "job.sh"
    script.write_text(text)
    syntax = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert syntax.returncode == 0, syntax.stderr
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STANDIN_DIR": str(workdir),
        "LC_ALL": "C",
        "SLURM_CPUS_ON_NODE": "2",
        "HF_TOKEN": "from-the-shell",
    }
    return subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=30,
        check=False,
    )


def _nul_split(path: Path) -> list[str]:
    return path.read_bytes().decode().split("\0")[:-1]


def _directives(text: str) -> list[str]:
    """What sbatch reads as options: #SBATCH lines before the first command."""
    lines = []
    for line in text.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            lines.append(line)
        elif line.strip() and not line.startswith("#"):
            break
    return lines


def check_script(
    target: str,
    command: list[str],
    env: dict[str, str],
    bin_dir: Path,
    workdir: Path,
    nodes: int = 2,
):
    """The script passes bash -n; run, it hands srun or docker exactly the command and env."""
    request = _request(target, command, env, nodes=nodes)
    text = render(request)
    twin = _plain_twin(target, command, env, nodes=nodes)
    assert text.count("\n") == twin.count("\n")
    out = run_script(text, bin_dir, workdir)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in workdir.iterdir() if "PWNED" in p.name) == []
    expected = ["run", "--", *command] if command else ["run"]
    if target == "docker":
        calls = [_nul_split(workdir / f"docker.{i}") for i in range(nodes)]
        for rank, argv in enumerate(calls):
            at = argv.index(IMAGE)
            assert argv[at + 1 :] == expected
            given = dict(
                item.split("=", 1) if "=" in item else (item, None)
                for flag, item in itertools.pairwise(argv[:at])
                if flag == "-e"
            )
            assert given == {
                "NNODES": str(nodes),
                "NODE_RANK": str(rank),
                "MASTER_ADDR": "10.0.0.1",
                "MASTER_PORT": "29500",
                "ENTRYPOINT_JOB_ID": "train",
                "ENTRYPOINT_JOB_TOKEN": None,
                "GPUS_PER_NODE": "8",
                **env,
                "HF_TOKEN": None,
            }
    else:
        assert _directives(text) == _directives(twin)
        argv = _nul_split(workdir / "srun.argv")
        at = argv.index("entrypoint")
        assert argv[at + 1 :] == expected
        environment = dict(item.split("=", 1) for item in _nul_split(workdir / "srun.env"))
        assert {key: environment.get(key) for key in env} == env
        assert environment["HF_TOKEN"] == "from-the-shell"


@pytest.mark.parametrize("target", SCRIPTS)
@pytest.mark.parametrize("values", [YAML_LOOKALIKES, BREAKERS], ids=["lookalikes", "breakers"])
def test_named_values_reach_the_command_exactly(standins, tmp_path, target, values):
    env = {f"V{i}": value for i, value in enumerate(values)}
    check_script(target, ["python", "train.py", *values], env, standins["record"], tmp_path)


@pytest.mark.parametrize("target", ["slurm-pyxis", "slurm-none", "docker"])
def test_the_issues_injection_runs_nothing(standins, tmp_path, target):
    """Issue 15: `-- python -c $'x\\ntouch PWNED #'` and `--env $'FOO=a\\ntouch PWNED #'`
    ended the `# Rendered by:` comment and ran `touch PWNED`."""
    check_script(
        target,
        ["python", "-c", "x\ntouch PWNED #"],
        {"FOO": "a\ntouch PWNED #"},
        standins["record"],
        tmp_path,
    )
    text = render(_request(target, ["python", "-c", "x\ntouch PWNED #"], {}))
    assert not any(line.startswith("touch") for line in text.splitlines())


@pytest.mark.parametrize("target", SCRIPTS)
def test_a_two_line_program_runs(standins, tmp_path, target):
    """An ordinary `python -c` program of two lines, with arguments and an --env value."""
    program = "import os, sys\nprint('two lines', sys.argv[1:], os.environ['GREETING'])"
    text = render(
        _request(
            target,
            [sys.executable, "-c", program, "a b", "it's"],
            {"GREETING": "héllo\nworld"},
            nodes=1,
        )
    )
    out = run_script(text, standins["run"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode() == "two lines ['a b', \"it's\"] héllo\nworld\n"


# ---------------------------------------------------------------------------------------------
# Options: checked where they are given

BASE = ["--nodes", "2", "--gpus-per-node", "8", "--image", IMAGE]
HUGE = "1" + "0" * 30


def _argv(platform: str, **options: str) -> list[str]:
    argv = [platform]
    values = {"nodes": "2", "gpus_per_node": "8", "image": IMAGE} | options
    for key, value in values.items():
        argv += [f"--{key.replace('_', '-')}", value]
    return argv


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (_argv("kubernetes", name="train\n"), "--name='train\\n': is not a lower-case name"),
        (_argv("kubernetes", name=""), "--name='': is not a lower-case name"),
        (_argv("kubernetes", name="Train"), "--name='Train': is not a lower-case name"),
        (_argv("kubernetes", name="a" * 41), f"--name='{'a' * 41}': is not a lower-case name"),
        (
            _argv("kubernetes", namespace="ml\n"),
            "--namespace='ml\\n': is not a Kubernetes namespace",
        ),
        (_argv("pytorchjob", namespace="ML"), "--namespace='ML': is not a Kubernetes namespace"),
        (_argv("volcano", namespace="a" * 64), "--namespace='aaaa"),
        (_argv("trainjob", secret_name="s\n"), "--secret-name='s\\n': is not a Kubernetes object"),
        (_argv("slurm", partition="gpu\n"), "--partition='gpu\\n': is not a partition name"),
        (_argv("slurm", partition="gpu batch"), "--partition='gpu batch': is not a partition name"),
        (_argv("slurm", partition=""), "--partition='': is not a partition name"),
        (_argv("slurm", account="ml\n#SBATCH --uid=0"), "--account='ml\\n#SBATCH --uid=0': is not"),
        (_argv("slurm", runtime=""), "--runtime='': is not a runtime render knows"),
        (_argv("slurm", time=""), "--time='': is not a SLURM time limit"),
        (_argv("slurm", time="1:00\n"), "--time='1:00\\n': is not a SLURM time limit"),
        (
            _argv("kubernetes", image="ghcr.io/Org/multinode:1.0"),
            (
                "--image='ghcr.io/Org/multinode:1.0': is not an image reference: "
                "the repository must be lower case"
            ),
        ),
        (
            _argv("docker", image="Multinode", master_addr="m"),
            "--image='Multinode': is not an image reference: the repository must be lower case",
        ),
        (
            _argv("slurm", image="multinode:dev\n"),
            "--image='multinode:dev\\n': is not an image ref",
        ),
        (_argv("volcano", image=""), "--image='': is not an image reference"),
        (_argv("volcano", image="ghcr.io/org/img:"), "--image='ghcr.io/org/img:': is not an image"),
        (_argv("volcano", image="img:a b"), "--image='img:a b': is not an image reference"),
        (_argv("volcano", image="img:" + "t" * 129), "--image='img:tttt"),
        (_argv("volcano", image="img@sha256:abc"), "--image='img@sha256:abc': is not an image"),
        (_argv("volcano", image="docker://img"), "--image='docker://img': is not an image"),
        (_argv("kubernetes", image="/shared/img.sqsh"), "--image='/shared/img.sqsh': is not an"),
        (_argv("slurm", image="/shared/my img.sqsh"), "--image='/shared/my img.sqsh': is not an"),
        (_argv("slurm", nodes="²"), "--nodes='²': not a whole number from 1 to 10000"),
        (_argv("slurm", nodes="10**30"), "--nodes='10**30': not a whole number from 1 to 10000"),
        (_argv("docker", nodes=HUGE, master_addr="m"), f"--nodes='{HUGE}': not a whole number"),
        (_argv("slurm", nodes="10001"), "--nodes='10001': not a whole number from 1 to 10000"),
        (_argv("slurm", nodes="-1"), "--nodes='-1': not a whole number"),
        (_argv("slurm", nodes="+2"), "--nodes='+2': not a whole number"),
        (_argv("slurm", nodes=" 2"), "--nodes=' 2': not a whole number"),
        (_argv("slurm", nodes="2\n"), "--nodes='2\\n': not a whole number"),
        (_argv("slurm", nodes="٢"), "--nodes='٢': not a whole number"),
        (
            _argv("kubernetes", gpus_per_node="²"),
            "--gpus-per-node='²': not a whole number from 0 to 256",
        ),
        (_argv("kubernetes", gpus_per_node="8.0"), "--gpus-per-node='8.0': not a whole number"),
        (_argv("kubernetes", gpus_per_node=""), "--gpus-per-node='': not a whole number"),
        (_argv("kubernetes", gpus_per_node="257"), "--gpus-per-node='257': not a whole number"),
        (
            _argv("kubernetes", master_port="65535"),
            "--master-port='65535': not a whole number from 1 to 65534",
        ),
        (_argv("kubernetes", master_port="²"), "--master-port='²': not a whole number"),
        (_argv("kubernetes", master_port="0"), "--master-port='0': not a whole number"),
        (
            _argv("docker", master_addr="10.0.0.1:29500"),
            (
                "--master-addr='10.0.0.1:29500': is host:port, not a host. "
                "Give --master-addr 10.0.0.1 --master-port 29500"
            ),
        ),
        (_argv("docker", master_addr="worker 0"), "--master-addr='worker 0': not one host name"),
        (_argv("docker", master_addr="m\n"), "--master-addr='m\\n': is not a host name"),
        (_argv("docker", master_addr=""), "--master-addr='': is set but empty"),
        # Issue 27: what a node would refuse as MASTER_ADDR, render refuses as --master-addr.
        (_argv("docker", master_addr="999.1.1.1"), "--master-addr='999.1.1.1': not a valid IPv4"),
        (_argv("docker", master_addr="1.2.3"), "--master-addr='1.2.3': not a valid IPv4"),
        (_argv("docker", master_addr="a..b"), "--master-addr='a..b': not a valid host name"),
        (_argv("docker", master_addr="m-"), "--master-addr='m-': not a valid host name"),
        (_argv("docker", master_addr="fe80::1"), "--master-addr='fe80::1': a link-local address"),
        (_argv("slurm", partition=","), "--partition=',': is not a partition name"),
        (_argv("slurm", partition="gpu,"), "--partition='gpu,': is not a partition name"),
        (_argv("slurm", partition="a,,b"), "--partition='a,,b': is not a partition name"),
        (_argv("slurm", account="a,b"), "--account='a,b': is not an account name"),
        (
            [*_argv("docker", master_addr="m"), "--env", "ENTRYPOINT_JOB_ID=other"],
            "--env='ENTRYPOINT_JOB_ID=other': the rendered spec sets ENTRYPOINT_JOB_ID itself",
        ),
        (
            [*_argv("kubernetes"), "--env", "ENTRYPOINT_JOB_TOKEN"],
            "--env='ENTRYPOINT_JOB_TOKEN': the rendered spec sets ENTRYPOINT_JOB_TOKEN itself",
        ),
        ([*_argv("slurm"), "--env", "FOO\n=a"], "--env='FOO\\n=a': is not KEY=VALUE"),
        ([*_argv("slurm"), "--env", "FOO=a\0b"], "--env='FOO=a\\x00b': holds a NUL character"),
        ([*_argv("slurm"), "--env", "FOO=\udcff"], "--env='FOO=\\udcff': is not valid UTF-8 text"),
        ([*_argv("slurm"), "--", "python", "-c", "a\0b"], "CMD='a\\x00b': holds a NUL character"),
        ([*_argv("slurm"), "--", "python", "\udcff"], "CMD='\\udcff': is not valid UTF-8 text"),
    ],
    ids=lambda value: value.split(":", 1)[0] if isinstance(value, str) else "",
)
def test_bad_option_one_line_exit_2(capsys, argv, start):
    assert main(["render", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith(f"entrypoint: error: {start}"), out.err


@pytest.mark.parametrize(
    ("platform", "image"),
    [
        ("kubernetes", "ghcr.io/org/multinode:1.0"),
        ("kubernetes", "localhost:5000/multinode"),
        ("kubernetes", "multinode:dev"),
        ("kubernetes", "ubuntu"),
        ("kubernetes", "a__b/c--d.e"),
        ("kubernetes", "nvcr.io/nvidia/pytorch:24.08-py3"),
        ("kubernetes", "Registry.EXAMPLE:443/a"),
        ("kubernetes", "[::1]:5000/x:Tag_1.0-rc"),
        ("kubernetes", "x@sha256:" + "a" * 64),
        ("kubernetes", "x:1@sha256:" + "0" * 64),
        ("slurm", "/shared/images/multinode.sqsh"),
        ("slurm", "/shared/images/multinode.sif"),
    ],
)
def test_image_references_accepted(platform, image):
    assert build(platform, nodes="2", gpus_per_node="8", image=image).image == image


@pytest.mark.parametrize(
    ("address", "bare"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("worker-0.example.com", "worker-0.example.com"),
        ("m", "m"),
        ("::1", "::1"),
        ("[fd00::2]", "fd00::2"),
        ("fe80::1%eth0", "fe80::1%eth0"),
        ("[fe80::1%eth0]", "fe80::1%eth0"),
    ],
)
def test_master_addresses_accepted(address, bare):
    # Kept bare, as the nodes plan it; the spec writes brackets only where a port follows.
    request = build("docker", nodes="2", gpus_per_node="8", image=IMAGE, master_addr=address)
    assert request.master_addr == bare
    assert f"-e MASTER_ADDR={bare} " in render(request).replace("'", "")


@pytest.mark.parametrize(
    ("address", "line"),
    [
        (
            "[fd00::2]:29500",
            "--master-addr='[fd00::2]:29500': is [address]:port, not a host. "
            "Give --master-addr fd00::2 --master-port 29500",
        ),
        ("[fe80::1]", "--master-addr='[fe80::1]': a link-local address without its zone"),
        ("fd00::2%eth0", "a zone (%interface) belongs on a link-local address"),
    ],
)
def test_ipv6_master_addresses_refused_with_the_fix(address, line):
    with pytest.raises(ConfigError) as err:
        build("docker", nodes="2", gpus_per_node="8", image=IMAGE, master_addr=address)
    assert line in err.value.line()


@pytest.mark.parametrize(
    "argv",
    [
        ["slurm", "--nodes", HUGE, "--gpus-per-node", "8", "--image", IMAGE],
        ["docker", "--nodes", "2", "--gpus-per-node", "²", "--image", IMAGE, "--master-addr", "m"],
    ],
)
def test_no_hang_no_traceback_in_a_real_process(argv):
    out = subprocess.run(
        [sys.executable, "-m", "entrypoint", "render", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_the_largest_job_renders():
    text = render(build("docker", nodes="10000", gpus_per_node="256", image=IMAGE, master_addr="m"))
    assert text.count("docker run") == 10000


# ---------------------------------------------------------------------------------------------
# Generated: any arguments, any values

# Any text an argv can carry: no NUL, valid UTF-8 (no lone surrogates; refused, see above).
WORDS = st.one_of(
    st.sampled_from(NAMED),
    st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12),
)
# The program word is not blank: render refuses `-- ''` (test_cli.py); the rest may be anything.
COMMANDS = st.one_of(
    st.just([]),
    st.builds(
        lambda first, rest: [first, *rest], WORDS.filter(str.strip), st.lists(WORDS, max_size=4)
    ),
)
ENVS = st.dictionaries(
    st.from_regex(r"V_[A-Z0-9_]{0,6}", fullmatch=True).filter(lambda key: not is_secret(key)),
    WORDS,
    max_size=3,
)
BOUNDED = settings(
    max_examples=int(os.environ.get("RENDER_EXAMPLES", "100")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@BOUNDED
@given(command=COMMANDS, env=ENVS)
def test_any_arguments_read_back_from_every_manifest(yamlread, command, env):
    with tempfile.TemporaryDirectory() as directory:
        check_manifests(yamlread, Path(directory), command, env)


@BOUNDED
@given(command=COMMANDS, env=ENVS, target=st.sampled_from(SCRIPTS), nodes=st.integers(1, 3))
def test_any_arguments_reach_the_command_from_every_script(standins, command, env, target, nodes):
    with tempfile.TemporaryDirectory() as directory:
        check_script(target, command, env, standins["record"], Path(directory), nodes=nodes)


OPTION_PLATFORMS = {
    "name": "kubernetes",
    "namespace": "pytorchjob",
    "secret_name": "volcano",
    "partition": "slurm",
    "account": "slurm",
    "time": "slurm",
    "runtime": "slurm",
    "image": "trainjob",
    "master_addr": "docker",
    "master_port": "kubernetes",
    "nodes": "slurm",
    "gpus_per_node": "volcano",
}


@BOUNDED
@given(
    option=st.sampled_from(sorted(OPTION_PLATFORMS)),
    value=st.one_of(WORDS, st.from_regex(r"[a-z0-9.:/@-]{1,20}\n?", fullmatch=True)),
)
def test_any_option_value_is_refused_in_one_line_or_changes_no_line(option, value):
    """Whatever an option holds, build refuses it with one line, or the spec has the lines it
    has with a plain value of the same length (no new command, directive, comment end or
    object)."""
    platform = OPTION_PLATFORMS[option]
    base = {
        "nodes": "2",
        "gpus_per_node": "8",
        "image": IMAGE,
        "master_addr": "10.0.0.1" if platform == "docker" else None,
    }
    try:
        request = build(platform, **base | {option: value})
    except ConfigError as err:
        assert "\n" not in err.line() and err.variable == "--" + option.replace("_", "-")
        return
    plain = {
        "nodes": "1",
        "master_port": "1",
        "runtime": value,
        "time": "1" * len(value),
        "gpus_per_node": "0" if value.isdigit() and int(value) == 0 else "1",
    }.get(option, "a" * len(value))
    twin = build(platform, **base | {option: plain})
    assert render(request).count("\n") == render(twin).count("\n")


HOSTS = st.one_of(
    st.from_regex(r"[a-z0-9._\[\]:%-]{1,24}", fullmatch=True),
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    st.builds(".".join, st.lists(st.integers(0, 999).map(str), min_size=1, max_size=5)),
)


@BOUNDED
@given(raw=HOSTS)
def test_any_master_addr_render_writes_is_one_the_nodes_accept(raw):
    """Issue 27: render and the nodes read an address alike; render writes none they refuse."""
    try:
        request = build("docker", nodes="2", gpus_per_node="8", image=IMAGE, master_addr=raw)
    except ConfigError as err:
        assert "\n" not in err.line() and err.variable == "--master-addr"
        return
    written = next(
        word.split("=", 1)[1] for word in render(request).split() if word.startswith("MASTER_ADDR=")
    )
    assert values.host("MASTER_ADDR", written) == written


@pytest.mark.parametrize("target", ["kubernetes", "pytorchjob", "trainjob", "volcano"])
def test_kubernetes_specs_wire_the_control_token_from_a_secret(target):
    """issue 17: the job's identity as a literal, the token from the job's own Secret, never a
    value in the manifest. Issue 28: the Secret is required (a pod without it does not start)
    unless rendered with --token optional."""
    text = render(_request(target, ["python", "train.py"], {}))
    assert "name: ENTRYPOINT_JOB_ID" in text and "name: ENTRYPOINT_JOB_TOKEN" in text
    assert "name: train-control" in text and "key: token" in text
    assert "optional: true" not in text
    assert "kubectl create secret generic train-control --from-literal=token=" in text
    assert "Without that Secret the pods do not start" in text
    assert _token_refs(text) and all("optional" not in ref for ref in _token_refs(text))
    optional = render(replace(_request(target, ["python", "train.py"], {}), token="optional"))
    assert all(ref.get("optional") is True for ref in _token_refs(optional))
    assert (
        "--token optional" in optional and "Without that Secret the pods start anyway" in optional
    )


def _token_refs(manifest: str) -> list[dict]:
    """Every secretKeyRef of ENTRYPOINT_JOB_TOKEN in the manifest."""
    found: list[dict] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if node.get("name") == "ENTRYPOINT_JOB_TOKEN":
                found.append(node["valueFrom"]["secretKeyRef"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for document in yaml.safe_load_all(manifest):
        walk(document)
    return found


@pytest.mark.parametrize("bad", ["maybe", "Optional", ""])
def test_an_unknown_token_mode_is_one_line(bad):
    with pytest.raises(ConfigError) as err:
        build("kubernetes", nodes="2", gpus_per_node="8", image=IMAGE, token=bad)
    assert err.value.line().startswith(f"--token={bad!r}: is not a token mode. Use required")


def test_only_kubernetes_platforms_take_token():
    with pytest.raises(ConfigError, match="is not an option of slurm"):
        build("slurm", nodes="2", gpus_per_node="8", image=IMAGE, token="optional")


def test_slurm_script_makes_a_fresh_token_per_job(tmp_path):
    text = render(_request("slurm", ["python", "train.py"], {}))
    line = next(ln for ln in text.splitlines() if ln.startswith("ENTRYPOINT_JOB_TOKEN="))
    out = subprocess.run(
        ["bash", "-c", f'set -e; {line}; printf %s "$ENTRYPOINT_JOB_TOKEN"'],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert out.returncode == 0 and len(out.stdout) == 64 and int(out.stdout, 16) >= 0
