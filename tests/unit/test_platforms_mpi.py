"""MPI launchers. Sources: Open MPI's variables
(https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html); Hydra's, from the proxy
that starts each rank (pmodels/mpich src/pm/hydra/proxy/pmip_cb.c: PMI_RANK, PMI_FD, PMI_SIZE,
MPI_LOCALNRANKS, MPI_LOCALRANKID); SLURM's look-alikes (SchedMD/slurm src/plugins/mpi/pmi2/
mpi_pmi2.c sets PMI_RANK and PMI_SIZE; src/plugins/mpi/pmix hands ranks PMIX_RANK); JAX's
jax/_src/clusters/ompi_cluster.py for the form of OMPI_MCA_orte_hnp_uri."""

import pytest

from entrypoint.plan import platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import mpi

# What the SLURM batch step leaves in the environment of everything mpirun starts.
SLURM_ALLOCATION = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_JOB_NODELIST": "gpu-[01-02]",
    "SLURM_NODELIST": "gpu-[01-02]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "2",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_GPUS_ON_NODE": "8",
}

# Open MPI 4: `mpirun -np 2 --map-by ppr:1:node -x MASTER_ADDR=gpu-01 entrypoint run` in sbatch -N2:
# rank 1, on the second node, whose inherited SLURM_PROCID says 0.
OMPI_ONE_PER_NODE = SLURM_ALLOCATION | {
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_NODE_RANK": "0",
    "OMPI_UNIVERSE_SIZE": "2",
    "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.0.0.1,172.17.0.1:34911",
    "MASTER_ADDR": "gpu-01",
}
# Open MPI: `mpirun -np 16 --map-by ppr:8:node -x MASTER_ADDR=gpu-01 ...`: rank 11 = node 1, GPU 3.
OMPI_ONE_PER_GPU = OMPI_ONE_PER_NODE | {
    "OMPI_COMM_WORLD_SIZE": "16",
    "OMPI_COMM_WORLD_RANK": "11",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "3",
    "OMPI_COMM_WORLD_NODE_RANK": "3",
    "OMPI_UNIVERSE_SIZE": "16",
}
# MPICH / Intel MPI Hydra: `mpiexec -n 2 -ppn 1 -hosts a,b -genv MASTER_ADDR a ...`: rank 1.
HYDRA_ONE_PER_NODE = {
    "PMI_RANK": "1",
    "PMI_SIZE": "2",
    "PMI_FD": "6",
    "MPI_LOCALNRANKS": "1",
    "MPI_LOCALRANKID": "0",
    "MASTER_ADDR": "a",
    "MASTER_PORT": "29600",
}
HYDRA_ONE_PER_GPU = HYDRA_ONE_PER_NODE | {
    "PMI_RANK": "11",
    "PMI_SIZE": "16",
    "MPI_LOCALNRANKS": "8",
    "MPI_LOCALRANKID": "3",
}
# Plain srun with --mpi=pmix / --mpi=pmi2: SLURM's, not an MPI launcher's.
SRUN_PMIX = SLURM_ALLOCATION | {
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "gpu-[01-02]",
    "PMIX_RANK": "0",
    "PMIX_NAMESPACE": "slurm.pmix.4242.0",
}
SRUN_PMI2 = SLURM_ALLOCATION | {
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "gpu-[01-02]",
    "PMI_RANK": "0",
    "PMI_SIZE": "2",
    "PMI_FD": "5",
    "PMI_JOBID": "4242.0",
}


@pytest.mark.parametrize(
    ("env", "nnodes", "node_rank", "spawn", "rank", "local_rank", "nproc"),
    [
        (OMPI_ONE_PER_NODE, 2, 1, True, None, None, None),
        (OMPI_ONE_PER_GPU, 2, 1, False, 11, 3, 8),
        (HYDRA_ONE_PER_NODE, 2, 1, True, None, None, None),
        (HYDRA_ONE_PER_GPU, 2, 1, False, 11, 3, 8),
    ],
)
def test_reading(env, nnodes, node_rank, spawn, rank, local_rank, nproc):
    r = mpi.read(env)
    assert r.platform == "mpi"
    assert (r.nnodes.value, r.node_rank.value, r.spawn.value) == (nnodes, node_rank, spawn)
    assert (
        r.rank and r.rank.value,
        r.local_rank and r.local_rank.value,
        r.nproc_per_node and r.nproc_per_node.value,
    ) == (rank, local_rank, nproc)
    assert r.master_addr.value == env["MASTER_ADDR"]
    assert r.master_port.value == int(env.get("MASTER_PORT", 29500))


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        (OMPI_ONE_PER_NODE, "OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_RANK set (Open MPI mpirun)"),
        (
            HYDRA_ONE_PER_NODE,
            "PMI_SIZE, PMI_RANK and MPI_LOCALNRANKS set (Hydra mpiexec (MPICH, Intel MPI))",
        ),
        (SRUN_PMIX, None),
        (SRUN_PMI2, None),
        (SLURM_ALLOCATION, None),
    ],
)
def test_detect(env, reason):
    assert mpi.detect(env) == reason


def test_mpirun_inside_slurm_wins_and_plain_srun_stays_slurm():
    assert platforms.detect(OMPI_ONE_PER_NODE)[0] is mpi
    assert platforms.detect(SRUN_PMIX)[0].NAME == "slurm"
    assert platforms.detect(SRUN_PMI2)[0].NAME == "slurm"


def test_one_node_needs_no_master():
    env = {k: v for k, v in OMPI_ONE_PER_GPU.items() if k != "MASTER_ADDR"}
    env |= {"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "3"}
    r = mpi.read(env)
    assert (r.nnodes.value, r.master_addr) == (1, None)


def test_entrypoint_master_addr_is_enough():
    env = {k: v for k, v in OMPI_ONE_PER_NODE.items() if k != "MASTER_ADDR"}
    assert mpi.read(env | {"ENTRYPOINT_MASTER_ADDR": "gpu-01"}).master_addr.value == "gpu-01"


def no_master(env):
    return {k: v for k, v in env.items() if k != "MASTER_ADDR"}


OUTSIDE_SLURM = {
    k: v for k, v in OMPI_ONE_PER_NODE.items() if not k.startswith("SLURM_") and k != "MASTER_ADDR"
}


@pytest.mark.parametrize(
    ("env", "master", "source"),
    [
        # mpirun in an sbatch script: the allocation's first node, as hostlist syntax says.
        (no_master(OMPI_ONE_PER_NODE), "gpu-01", "env SLURM_JOB_NODELIST (first host"),
        (
            no_master(HYDRA_ONE_PER_NODE) | {"SLURM_NODELIST": "dgx[7,3]"},
            "dgx7",
            "env SLURM_NODELIST (first host",
        ),
        # Open MPI 4 outside SLURM: mpirun's own host, the first address of its HNP URI.
        (OUTSIDE_SLURM, "10.0.0.1", f"env {mpi.HNP_URI}"),
        # What is exported wins over anything derived.
        (OUTSIDE_SLURM | {"MASTER_ADDR": "head"}, "head", "env MASTER_ADDR"),
    ],
)
def test_master_derived_where_the_environment_says_it(env, master, source):
    r = mpi.read(env)
    assert r.master_addr.value == master and str(r.master_addr.source).startswith(source)


@pytest.mark.parametrize(
    ("env", "variable", "words"),
    [
        # Open MPI 5 (PRRTE, no HNP URI) and Hydra outside SLURM: nothing says where rank 0 is.
        (
            {k: v for k, v in OUTSIDE_SLURM.items() if k != mpi.HNP_URI}
            | {"OMPI_VERSION": "5.0.3"},
            "MASTER_ADDR",
            "mpirun -x MASTER_ADDR=",
        ),
        (no_master(HYDRA_ONE_PER_NODE), "MASTER_ADDR", "mpiexec -genv MASTER_ADDR"),
        # mpirun's host reachable over IPv6 only, its first address link-local: no zone says
        # which interface reaches it.
        (
            OUTSIDE_SLURM | {mpi.HNP_URI: "1314521088.0;tcp6://[fe80::1,2620:10d::2]:43370"},
            mpi.HNP_URI,
            "link-local address without its zone",
        ),
        (
            OMPI_ONE_PER_NODE | {"OMPI_COMM_WORLD_RANK": "2"},
            "OMPI_COMM_WORLD_RANK",
            "must be below",
        ),
        (OMPI_ONE_PER_NODE | {"OMPI_COMM_WORLD_SIZE": "x"}, "OMPI_COMM_WORLD_SIZE", "positive"),
        (
            OMPI_ONE_PER_GPU | {"OMPI_COMM_WORLD_SIZE": "12", "OMPI_COMM_WORLD_RANK": "3"},
            "OMPI_COMM_WORLD_SIZE",
            "not a multiple of OMPI_COMM_WORLD_LOCAL_SIZE=8",
        ),
        # --map-by node: rank 1 is the first rank of the second node.
        (
            OMPI_ONE_PER_GPU | {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
            "OMPI_COMM_WORLD_RANK",
            "not placed node by node",
        ),
        (HYDRA_ONE_PER_GPU | {"MPI_LOCALRANKID": "8"}, "MPI_LOCALRANKID", "must be below"),
        (HYDRA_ONE_PER_NODE | {"MASTER_PORT": "65536"}, "MASTER_PORT", "TCP port"),
    ],
)
def test_bad_values(env, variable, words):
    with pytest.raises(ConfigError) as err:
        mpi.read(env)
    assert err.value.variable == variable
    assert words in err.value.line() and "\n" not in err.value.line()


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "mpi": {
        "OMPI_COMM_WORLD_SIZE": "16",
        "OMPI_COMM_WORLD_RANK": "9",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    },
    "mpi-hydra": {
        "PMI_SIZE": "2",
        "PMI_RANK": "1",
        "MPI_LOCALNRANKS": "1",
        "MPI_LOCALRANKID": "0",
        "MASTER_ADDR": "node-0",
    },
}
