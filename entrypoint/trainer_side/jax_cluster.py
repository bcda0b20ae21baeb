"""`jax.distributed.initialize()` with no arguments, on every platform the plan reads.

JAX 0.12 takes the coordinator address (JAX_COORDINATOR_ADDRESS) and the local device ids
(JAX_LOCAL_DEVICE_IDS) from the environment, but the process count and id only from arguments
or from a `ClusterEnv` subclass that recognises its platform (SLURM, Open MPI, Kubernetes, TPU);
anywhere else it stops with "Number of processes must be defined". The plan knows both for every
platform and writes them (JAX_NUM_PROCESSES, JAX_PROCESS_ID); `EntrypointCluster` hands them to
JAX. It goes first in JAX's list, so that mpirun inside a SLURM allocation (where JAX's own
SLURM reader sees the daemons, not the ranks) gets the plan's values; arguments the trainer
passes still win, since JAX asks a ClusterEnv only for what is unset.

Under torchrun (the default launcher, one process per GPU or per CPU worker) the plan writes no
JAX_* variables, since each worker's id is its own: EntrypointCluster reads torchrun's instead
(`from_torchrun`): WORLD_SIZE processes, this one RANK, on GPU nodes the GPU LOCAL_RANK, and the
coordinator on node 0 at MASTER_PORT - 1 (torchrun's store holds MASTER_PORT, the entrypoint's
control channel and /metrics the ports after it: plan/ports.py). Process 0 says so in one line.

The trainer's process registers it through `site-hook/sitecustomize.py`, which the plan puts on
the trainer's PYTHONPATH: `install()` waits for the first import of `jax._src.clusters` and
defines the class there. jax is never imported on its behalf.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from entrypoint.trainer_side.after_import import when_imported
from entrypoint.trainer_side.world_check import PLAN_VARIABLE

TARGET = "jax._src.clusters"  # the package that defines ClusterEnv and imports JAX's own
NUM_PROCESSES = "JAX_NUM_PROCESSES"
PROCESS_ID = "JAX_PROCESS_ID"
COORDINATOR = "JAX_COORDINATOR_ADDRESS"
SITE_HOOK = Path(__file__).parent / "site-hook"  # the directory the plan puts on PYTHONPATH
WORKER_OF_TORCHRUN = "TORCHELASTIC_RUN_ID"  # torchrun gives it to its workers
LAST_PORT = 65535


def coordinator_port(master_port: int) -> int:
    """The JAX coordinator's port beside torchrun's store: MASTER_PORT - 1 (the control channel
    and /metrics take the ports after it), MASTER_PORT + 3 below port 2."""
    return master_port - 1 if master_port > 1 else master_port + 3


def from_torchrun(env: Mapping[str, str]) -> dict[str, str] | None:
    """JAX's values for a worker of the entrypoint's torchrun (its plan file and torchrun's run id
    set, and the JAX variables not: the jax and direct launchers write those): the process count
    and id, the coordinator, and the GPU this process owns ("" on CPU nodes, JAX_PLATFORMS=cpu).
    None for any other process, or when torchrun's variables are missing."""
    if (
        not env.get(PLAN_VARIABLE)
        or WORKER_OF_TORCHRUN not in env
        or env.get(PROCESS_ID, "").strip()
    ):
        return None
    try:
        world, rank, local = (int(env[n]) for n in ("WORLD_SIZE", "RANK", "LOCAL_RANK"))
        host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except (KeyError, ValueError):
        return None
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    coordinator = env.get(COORDINATOR, "").strip() or f"{host}:{coordinator_port(port)}"
    cpu = env.get("JAX_PLATFORMS", "").strip().lower() == "cpu"
    return {
        NUM_PROCESSES: str(world),
        PROCESS_ID: str(rank),
        COORDINATOR: coordinator,
        "local": "" if cpu else str(local),
    }


def _said(values: Mapping[str, str]) -> None:
    """Process 0's one line: what JAX was given, and where it came from."""
    if values[PROCESS_ID] == "0":
        print(
            f"entrypoint: jax.distributed.initialize(): {values[NUM_PROCESSES]} processes "
            f"(torchrun's WORLD_SIZE), each its RANK, coordinator {values[COORDINATOR]} "
            "(MASTER_PORT - 1: torchrun's store holds MASTER_PORT)"
            + ("" if not values["local"] else ", each process the GPU of its LOCAL_RANK"),
            file=sys.stderr,
            flush=True,
        )


def register(clusters: ModuleType) -> type:
    """Define EntrypointCluster as a subclass of `clusters.ClusterEnv` (JAX records every
    subclass when it is defined) and move it to the front of JAX's list."""
    base = clusters.ClusterEnv

    class EntrypointCluster(base):  # type: ignore[misc, valid-type]
        """The entrypoint's plan: JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_COORDINATOR_ADDRESS;
        under torchrun, its worker's variables (from_torchrun)."""

        name = "entrypoint"

        @staticmethod
        def _values() -> Mapping[str, str] | None:
            found = from_torchrun(os.environ)
            if found is not None:
                return found
            if all(os.environ.get(n, "").strip() for n in (NUM_PROCESSES, PROCESS_ID, COORDINATOR)):
                return {n: os.environ[n] for n in (NUM_PROCESSES, PROCESS_ID, COORDINATOR)}
            return None

        @classmethod
        def is_env_present(cls) -> bool:
            return cls._values() is not None

        @classmethod
        def get_coordinator_address(
            cls, timeout_secs: int | None = None, override_coordinator_port: str | None = None
        ) -> str:
            values = cls._values()
            assert values is not None
            if "local" in values:
                _said(values)
            address = values[COORDINATOR]
            if override_coordinator_port:  # JAX_COORDINATOR_PORT
                return f"{address.rsplit(':', 1)[0]}:{override_coordinator_port}"
            return address

        @classmethod
        def get_process_count(cls) -> int:
            values = cls._values()
            assert values is not None
            return int(values[NUM_PROCESSES])

        @classmethod
        def get_process_id(cls) -> int:
            values = cls._values()
            assert values is not None
            return int(values[PROCESS_ID])

        @classmethod
        def get_local_process_id(cls) -> int | None:
            # The jax and direct launchers write JAX_LOCAL_DEVICE_IDS, which JAX reads itself;
            # under torchrun each process owns the GPU of its LOCAL_RANK.
            local = (cls._values() or {}).get("local")
            return int(local) if local else None

    found = base._cluster_types
    if EntrypointCluster in found:
        found.remove(EntrypointCluster)
    found.insert(0, EntrypointCluster)
    return EntrypointCluster


def _register_quietly(clusters: ModuleType) -> None:
    try:
        register(clusters)
    except Exception as err:  # a JAX without ClusterEnv: the trainer passes arguments itself
        print(
            f"entrypoint: jax.distributed.initialize() without arguments is not available "
            f"in this JAX ({type(err).__name__}: {err}); pass num_processes and process_id "
            f"from {NUM_PROCESSES} and {PROCESS_ID}",
            file=sys.stderr,
        )


def install() -> None:
    """Register now if JAX's clusters are loaded, else when they are first imported."""
    when_imported(TARGET, _register_quietly)
