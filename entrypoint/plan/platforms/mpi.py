"""MPI launchers: Open MPI's mpirun (also prterun, Open MPI 5) and MPICH/Intel MPI's Hydra mpiexec.

Open MPI sets OMPI_COMM_WORLD_SIZE, _RANK, _LOCAL_SIZE, _LOCAL_RANK in every process
(https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html; _NODE_RANK counts across
all jobs on the node, so it is not a node index). Hydra's proxy sets PMI_RANK, PMI_SIZE,
MPI_LOCALRANKID, MPI_LOCALNRANKS (mpich src/pm/hydra/proxy/pmip_cb.c).

Detection is strict because srun sets look-alikes: `srun --mpi=pmi2` sets PMI_RANK/PMI_SIZE
(slurm src/plugins/mpi/pmi2/mpi_pmi2.c) and `srun --mpi=pmix` sets PMIX_RANK, but neither sets
OMPI_COMM_WORLD_* or MPI_LOCALNRANKS; those stay SLURM's. When mpirun runs inside an allocation,
the SLURM_* its processes inherit describe mpirun's daemons (SLURM_PROCID is the daemon's index),
so this module comes before slurm.

MPI names no master, so it is taken, in order, from: MASTER_ADDR (or ENTRYPOINT_MASTER_ADDR)
exported to every rank; inside a SLURM allocation, the first host of SLURM_JOB_NODELIST (mpirun
maps rank 0 to the allocation's first node, where the batch script and mpirun itself run); Open
MPI 4's OMPI_MCA_orte_hnp_uri, the address of mpirun's own host (what JAX's ompi_cluster.py
uses: rank 0 runs there unless --host or a hostfile puts it elsewhere, and then MASTER_ADDR is
needed). Open MPI 5 (PRRTE) and Hydra tell a rank nothing of where rank 0 runs: MASTER_ADDR.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.hostlist import expand_var
from entrypoint.plan.platforms import slurm
from entrypoint.plan.platforms.base import (
    Reading,
    named_by,
    node_reading,
    read_addr,
    read_count,
    read_index,
    read_port,
    require,
)
from entrypoint.plan.values import (
    PER_NODE,
    PROCESSES,
    Sourced,
    below,
    by_default,
    derived,
    env_var,
    host,
)

NAME = "mpi"
DOCS = "https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html"

# (world size, rank, ranks on this node, rank on this node) per launcher family.
OPEN_MPI = (
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
)
HYDRA = ("PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID")
MASTER_ADDR = ("MASTER_ADDR", "ENTRYPOINT_MASTER_ADDR")
MASTER_PORT = ("MASTER_PORT",)
ALLOCATION = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")  # the allocation mpirun runs inside
HNP_URI = "OMPI_MCA_orte_hnp_uri"  # Open MPI 4: `1531576320.0;tcp://10.0.0.1,10.0.1.1:34911`
_HNP_HOST = re.compile(r"tcp://([^,:;]+)|tcp6://\[([^,\]]+)")


def _family(env: Mapping[str, str]) -> tuple[str, tuple[str, str, str, str]] | None:
    if all(env.get(n, "").strip() for n in OPEN_MPI[:2]):
        return "Open MPI mpirun", OPEN_MPI
    if all(env.get(n, "").strip() for n in HYDRA[:3]):
        return "Hydra mpiexec (MPICH, Intel MPI)", HYDRA
    return None


def detect(env: Mapping[str, str]) -> str | None:
    found = _family(env)
    if found is None:
        return None
    launcher, names = found
    shown = names[:2] if names is OPEN_MPI else names[:3]
    return f"{', '.join(shown[:-1])} and {shown[-1]} set ({launcher})"


def placed_ranks(
    launcher: str,
    names: tuple[str, ...],
    world: Sourced[int],
    rank: Sourced[int],
    local_size: Sourced[int],
    local_rank: Sourced[int],
) -> tuple[Sourced[int], Sourced[int], dict, list[str]]:
    """Several ranks per node, started by mpirun itself: they must fill node by node, and this
    process is placed, not spawned. (nnodes, node_rank, the placement, notes)."""
    size_n, rank_n, lsize_n, lrank_n = names
    if world.value % local_size.value:
        raise ConfigError(
            size_n,
            world.value,
            f"is not a multiple of {lsize_n}={local_size.value}",
            "Start the same number of ranks on every node (mpirun --map-by ppr:N:node)",
        )
    if rank.value % local_size.value != local_rank.value:
        raise ConfigError(
            rank_n,
            rank.value,
            f"is not placed node by node ({lrank_n}={local_rank.value})",
            "Fill one node before the next (mpirun --map-by slot or ppr:N:node, not --map-by node)",
        )
    nnodes = Sourced(world.value // local_size.value, derived(f"{size_n} / {lsize_n}", size_n))
    node_rank = Sourced(rank.value // local_size.value, derived(f"{rank_n} // {lsize_n}", rank_n))
    more: dict = {
        "spawn": Sourced(
            False,
            derived(
                f"{local_size.value} ranks per node ({lsize_n}): "
                f"{launcher} started one process per GPU"
            ),
        ),
        "rank": rank,
        "local_rank": local_rank,
        "nproc_per_node": local_size,
    }
    notes = [f"{launcher} started {local_size.value} ranks per node: {size_n} counts processes"]
    return nnodes, node_rank, more, notes


def read(env: Mapping[str, str]) -> Reading:
    launcher, (size_n, rank_n, lsize_n, lrank_n) = _family(env) or ("MPI", OPEN_MPI)
    world = require(read_count(env, size_n, limit=PROCESSES), size_n, "the number of ranks")
    rank = require(read_index(env, rank_n, limit=PROCESSES), rank_n, "the rank")
    below(rank_n, rank.value, size_n, world.value)
    local_size = read_count(env, lsize_n, limit=PER_NODE) or Sourced(
        1, by_default(f"default 1 ({lsize_n} unset)", lsize_n)
    )
    local_rank = read_index(env, lrank_n, limit=PER_NODE) or Sourced(
        0, by_default(f"default 0 ({lrank_n} unset)", lrank_n)
    )
    below(lrank_n, local_rank.value, lsize_n, local_size.value)

    if local_size.value == 1:
        nnodes = Sourced(world.value, env_var(size_n, "(one rank per node)"))
        node_rank = Sourced(rank.value, env_var(rank_n, "(one rank per node)"))
        more: dict = {
            "spawn": Sourced(
                True, derived(f"{lsize_n}=1: one rank per node, the entrypoint spawns the workers")
            )
        }
        notes = [f"{launcher} started one rank per node: {size_n} counts nodes"]
    else:
        nnodes, node_rank, more, notes = placed_ranks(
            launcher, (size_n, rank_n, lsize_n, lrank_n), world, rank, local_size, local_rank
        )

    master = read_addr(env, *MASTER_ADDR)
    if master is None and nnodes.value > 1:
        master = _derived_master(env)
    if master is None and nnodes.value > 1:
        raise ConfigError(
            "MASTER_ADDR",
            None,
            f"{launcher} does not tell the ranks where rank 0 runs (no "
            f"SLURM allocation, no {HNP_URI})",
            "Export it to every rank: mpirun -x MASTER_ADDR=<rank 0's host> (Open MPI) or "
            "mpiexec -genv MASTER_ADDR <rank 0's host> (MPICH)",
        )
    return node_reading(
        NAME,
        env,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master,
        master_port=read_port(env, *MASTER_PORT),
        notes=tuple(notes),
        **more,
    )


def _derived_master(env: Mapping[str, str]) -> Sourced[str] | None:
    """Where rank 0 runs when MASTER_ADDR is not exported: the allocation's first node, else
    mpirun's own host (Open MPI 4)."""
    for name in ALLOCATION:
        raw = env.get(name, "").strip()
        if raw:
            return Sourced(
                host(name, expand_var(name, raw)[0]),
                env_var(name, "(first host: mpirun puts rank 0 on the allocation's first node)"),
            )
    found = _HNP_HOST.search(env.get(HNP_URI, ""))
    if found:
        return Sourced(
            host(HNP_URI, found.group(1) or found.group(2)),
            derived(
                f"env {HNP_URI} (mpirun's own host, where rank 0 runs unless --host or a "
                "hostfile moves it)"
            ),
        )
    return None


def job_identity(env: Mapping[str, str]) -> str:
    """The MPI launcher's job namespace (PMIx, Open MPI), else the SLURM job it runs in."""
    return named_by(env, "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid") or slurm.job_identity(env)
