"""`jax.distributed.initialize()` with no arguments, on every platform the plan reads.

JAX 0.12 takes the coordinator address (JAX_COORDINATOR_ADDRESS) and the local device ids
(JAX_LOCAL_DEVICE_IDS) from the environment, but the process count and id only from arguments
or from a `ClusterEnv` subclass that recognises its platform (SLURM, Open MPI, Kubernetes, TPU);
anywhere else it stops with "Number of processes must be defined". The plan knows both for every
platform and writes them (JAX_NUM_PROCESSES, JAX_PROCESS_ID); `EntrypointCluster` hands them to
JAX. It goes first in JAX's list, so that mpirun inside a SLURM allocation (where JAX's own
SLURM reader sees the daemons, not the ranks) gets the plan's values; arguments the trainer
passes still win, since JAX asks a ClusterEnv only for what is unset.

The trainer's process registers it through `site-hook/sitecustomize.py`, which the plan puts on
the trainer's PYTHONPATH: `install()` waits for the first import of `jax._src.clusters` and
defines the class there. jax is never imported on its behalf.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

from entrypoint.trainer_side.after_import import when_imported

TARGET = "jax._src.clusters"  # the package that defines ClusterEnv and imports JAX's own
NUM_PROCESSES = "JAX_NUM_PROCESSES"
PROCESS_ID = "JAX_PROCESS_ID"
COORDINATOR = "JAX_COORDINATOR_ADDRESS"
SITE_HOOK = Path(__file__).parent / "site-hook"  # the directory the plan puts on PYTHONPATH


def register(clusters: ModuleType) -> type:
    """Define EntrypointCluster as a subclass of `clusters.ClusterEnv` (JAX records every
    subclass when it is defined) and move it to the front of JAX's list."""
    base = clusters.ClusterEnv

    class EntrypointCluster(base):  # type: ignore[misc, valid-type]
        """The entrypoint's plan: JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_COORDINATOR_ADDRESS."""

        name = "entrypoint"

        @classmethod
        def is_env_present(cls) -> bool:
            return all(
                os.environ.get(n, "").strip() for n in (NUM_PROCESSES, PROCESS_ID, COORDINATOR)
            )

        @classmethod
        def get_coordinator_address(
            cls, timeout_secs: int | None = None, override_coordinator_port: str | None = None
        ) -> str:
            address = os.environ[COORDINATOR]
            if override_coordinator_port:  # JAX_COORDINATOR_PORT
                return f"{address.rsplit(':', 1)[0]}:{override_coordinator_port}"
            return address

        @classmethod
        def get_process_count(cls) -> int:
            return int(os.environ[NUM_PROCESSES])

        @classmethod
        def get_process_id(cls) -> int:
            return int(os.environ[PROCESS_ID])

        @classmethod
        def get_local_process_id(cls) -> int | None:
            return None  # JAX_LOCAL_DEVICE_IDS, written by the plan, says which GPUs

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
