"""Real SLURM: Debian's slurmctld and slurmd in two containers of the image (tests/slurm/), a
controller+node and a node on a private network, and the sbatch script that
`entrypoint render slurm --runtime none` writes, submitted with sbatch. Each srun task is
`entrypoint run`, reading what SLURM itself set. Checked from the workers' own
results files (both containers) and from `scontrol show job`: the built-in job trained across
both nodes on CPU, 2 workers per node, and the job COMPLETED.

The job steps run as the image's user (trainer, uid 1000); the daemons run as root.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from entrypoint.local.cluster import LABEL, Cluster, Node, read_results

ROOT = Path(__file__).parents[2]
SLURM = ROOT / "tests" / "slurm"
JOB = "multinode-test"
STEPS = 40  # the loss falls clearly (~4.3 -> ~1.9) in a few seconds of training
WORKERS = 2  # per node
BUILD_TIMEOUT = 900  # first build downloads Debian's SLURM packages; later ones hit the cache
IDLE_TIMEOUT = 90  # daemons up and both nodes idle
JOB_TIMEOUT = 300  # submit to COMPLETED; ~40-60 s on 2 idle cores
ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def _docker_cli() -> str:
    """A client whose `docker build` is BuildKit (as docker/build.sh picks it)."""
    if os.environ.get("DOCKER"):
        return os.environ["DOCKER"]
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0
    ):
        return "docker"
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


def _ca_bundle() -> str | None:
    """The CA bundle apt trusts in the build, as docker/build.sh finds it."""
    for c in (
        os.environ.get("CA_BUNDLE"),
        os.environ.get("PIP_CERT"),
        os.environ.get("SSL_CERT_FILE"),
        os.environ.get("REQUESTS_CA_BUNDLE"),
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ):
        if c and c != "none" and Path(c).is_file() and Path(c).stat().st_size:
            return c
    return None


@pytest.fixture(scope="session")
def slurm_image(image, docker_client):
    """tests/slurm/Dockerfile built FROM the image, under a tag of this session's own, removed
    at the end (BuildKit's cache keeps its layers, so the next build is seconds)."""
    tag = f"multinode-slurm:test-{secrets.token_hex(3)}"
    ca = _ca_bundle()
    command = [
        _docker_cli(),
        "build",
        "-q",
        "-f",
        str(SLURM / "Dockerfile"),
        "--build-arg",
        f"IMAGE={image}",
        "--label",
        f"{LABEL}=slurm-test",
        "-t",
        tag,
        *(["--secret", f"id=ca,src={ca}"] if ca else []),
        str(ROOT),
    ]
    began = time.monotonic()
    try:
        out = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            env=os.environ | {"DOCKER_BUILDKIT": "1"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"building {tag} took over {BUILD_TIMEOUT} s", pytrace=False)
    if out.returncode != 0:
        pytest.fail(
            f"building {tag} failed:\n{out.stdout[-4000:]}{out.stderr[-4000:]}", pytrace=False
        )
    print(f"built {tag} from {image} in {time.monotonic() - began:.1f} s")
    yield tag
    from docker.errors import APIError, NotFound

    try:
        docker_client.images.remove(tag)
    except NotFound:
        pass
    except APIError as err:
        print(f"could not remove {tag}: {err}")


def sh(container, command: str, *, user: str = "root", env: dict | None = None) -> tuple[int, str]:
    code, out = container.exec_run(["bash", "-c", command], user=user, environment=env or {})
    return code, out.decode(errors="replace")


def wait_idle(controller, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        code, seen = sh(controller, "sinfo -h -N -o '%N %t'")
        states = dict(line.split() for line in seen.splitlines() if len(line.split()) == 2)
        if code == 0 and all(states.get(n) == "idle" for n in names):
            return
        time.sleep(1)
    pytest.fail(f"nodes not idle after {timeout:.0f} s: sinfo says {seen!r}")


def job_state(controller, job_id: str) -> dict[str, str]:
    """`scontrol show job -o`: one line of Key=Value pairs (no sacct without slurmdbd)."""
    _, out = sh(controller, f"scontrol show job -o {job_id}")
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def put(container, path: str, text: str, mode: int = 0o755) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo(Path(path).name)
        info.size, info.mode = len(text.encode()), mode
        tar.addfile(info, io.BytesIO(text.encode()))
    container.put_archive(str(Path(path).parent), data.getvalue())


def sbatch_script(tmp_path: Path, image: str) -> str:
    """What a user submits: the real `entrypoint render` command's output."""
    out = tmp_path / "job.sbatch"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "entrypoint",
            "render",
            "slurm",
            "--runtime",
            "none",
            "--nodes",
            "2",
            "--gpus-per-node",
            "0",
            "--image",
            image,
            "--name",
            JOB,
            "--env",
            f"ENTRYPOINT_NPROC_PER_NODE={WORKERS}",
            "--env",
            f"ENTRYPOINT_JOB_STEPS={STEPS}",
            "--env",
            "ENTRYPOINT_LOG_ALL_NODES=true",
            "-o",
            str(out),
        ],
        check=True,
        timeout=60,
    )
    return out.read_text()


def test_sbatch_trains_across_two_nodes(slurm_image, docker_client, tmp_path):
    script = sbatch_script(tmp_path, slurm_image)
    print(script)
    with Cluster(slurm_image, client=docker_client, echo=print) as c:
        names = [c.hostname("slurm", i) for i in (0, 1)]  # node 0 also runs slurmctld
        began = time.monotonic()
        for name in names:
            c.start(Node(name, {}, command=[names[0], *names]))
        controller, other = (c.containers[n] for n in names)
        wait_idle(controller, names, IDLE_TIMEOUT)
        up = time.monotonic() - began

        put(controller, "/tmp/job.sbatch", script)
        # the submit directory is where the logs go: the image user's home, on every node
        code, out = sh(
            controller, "cd /home/trainer && sbatch --parsable /tmp/job.sbatch", user="trainer"
        )
        assert code == 0, out
        job_id = out.strip().split(";")[0]
        submitted = time.monotonic()
        state: dict[str, str] = {}
        while time.monotonic() < submitted + JOB_TIMEOUT:
            state = job_state(controller, job_id)
            if state.get("JobState") in ENDED:
                break
            time.sleep(2)
        ran = time.monotonic() - submitted
        for name, container in zip(names, (controller, other), strict=True):
            _, output = sh(container, f"cd /home/trainer && tail -n +1 {JOB}-{job_id}*.out")
            print(f"--- job {job_id} output files on {name} ---\n{output}\n--- end ---")
        if state.get("JobState") not in ENDED:
            sh(controller, f"scancel {job_id}")
            pytest.fail(f"job {job_id} still {state.get('JobState')} after {JOB_TIMEOUT} s")
        assert (state["JobState"], state.get("ExitCode")) == ("COMPLETED", "0:0"), state
        assert state["NumNodes"] == "2" and state["UserId"].startswith("trainer("), state

        by_node = {
            name: read_results(container)
            for name, container in zip(names, (controller, other), strict=True)
        }
    world = 2 * WORKERS
    everyone = sorted((r for rs in by_node.values() for r in rs), key=lambda r: r["rank"])
    assert [r["rank"] for r in everyone] == list(range(world)), by_node
    for node_rank, name in enumerate(names):  # hostlist order: node 0 holds ranks 0..W-1
        got = sorted(by_node[name], key=lambda r: r["rank"])
        assert [r["rank"] for r in got] == list(
            range(node_rank * WORKERS, (node_rank + 1) * WORKERS)
        ), (name, got)
        for r in got:
            assert r["job"] == "deepspeed" and r["world_size"] == world, r
            assert (r["node"], r["node_rank"]) == (name, node_rank), r
            assert r["local_rank"] == r["rank"] - node_rank * WORKERS, r
            assert r["steps"] == STEPS and r["resumed_from"] is None, r
            assert r["final_loss"] < r["first_loss"] - 1.0, r  # from ~4.3 (guessing is 4.16)
    assert [r["rank"] for r in everyone if r["checkpoint_writer"]] == [0]
    print(f"slurm: daemons up in {up:.1f} s, job {job_id} {ran:.1f} s")
