"""JAX's documented multi-process start, `jax.distributed.initialize()` with no arguments, run
unmodified through `entrypoint run` in the image (JAX 0.12 alone stops with "Number of processes
must be defined" outside SLURM and Open MPI). Two hand-started nodes on one container's
loopback; tests/compat runs the same trainer across node containers on every convention."""

from __future__ import annotations

import pytest

from .test_job import docker_env, writable

# From JAX's guide "Multi-process environments": initialize, then every process sees the
# global device count and a collective across processes.
DOCUMENTED = """\
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

jax.distributed.initialize{args}
ranks = multihost_utils.process_allgather(jnp.array([jax.process_index()]))
print(f"jax process {{jax.process_index()}} of {{jax.process_count()}}: "
      f"{{jax.device_count()}} devices, gathered {{sorted(ranks.ravel().tolist())}}", flush=True)
"""

EXPLICIT = """(
    num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
    process_id=int(os.environ["JAX_PROCESS_ID"]))"""


def run_two_nodes(image, tmp_path, trainer: str, *extra: str) -> str:
    src = writable(tmp_path / "src")
    (src / "train_jax.py").write_text(trainer)
    env = {
        "ENTRYPOINT_GPUS_PER_NODE": "0",
        "NNODES": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "ENTRYPOINT_SOCKET_IFNAME": "lo",
        "ENTRYPOINT_LAUNCHER": "jax",
    }
    command = "entrypoint run -- python /src/train_jax.py"
    script = (
        f"NODE_RANK=1 {command} & one=$!; NODE_RANK=0 {command}; zero=$?; "
        "wait $one; exit $((zero + $?))"
    )
    proc = image.run(
        "-c",
        script,
        entrypoint="sh",
        timeout=300,
        docker_args=("-v", f"{src}:/src:ro", *extra, *docker_env(env)),
    )
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("args", ["()", EXPLICIT], ids=["no-arguments", "explicit"])
def test_jax_documented_start_runs_unmodified(image, tmp_path, args):
    trainer = DOCUMENTED.format(args=args)
    if args != "()":
        trainer = "import os\n" + trainer
    log = run_two_nodes(image, tmp_path, trainer)
    for rank in (0, 1):
        assert f"jax process {rank} of 2: 2 devices, gathered [0, 1]" in log, log
    assert "Number of processes must be defined" not in log


def test_a_sitecustomize_of_the_users_own_still_runs(image, tmp_path):
    """The site hook shadows any sitecustomize on the path; it runs that one too."""
    own = writable(tmp_path / "own")
    (own / "sitecustomize.py").write_text("print('users sitecustomize ran', flush=True)\n")
    log = run_two_nodes(
        image,
        tmp_path,
        DOCUMENTED.format(args="()"),
        "-v",
        f"{own}:/own:ro",
        "-e",
        "PYTHONPATH=/own",
    )
    assert log.count("users sitecustomize ran") >= 2
    assert "jax process 1 of 2: 2 devices, gathered [0, 1]" in log, log
