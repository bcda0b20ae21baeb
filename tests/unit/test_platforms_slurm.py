"""SLURM, with the variables srun sets in each task.
Source: https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES and
https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES (SLURM 22.05-24.11)."""

import pytest

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.platforms import slurm

# sbatch -N2 --ntasks-per-node=1 --gres=gpu:8, then `srun entrypoint run`: task on the 2nd node.
ONE_TASK_PER_NODE = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_JOB_NAME": "train",
    "SLURM_JOB_NODELIST": "gpu-[01-02]",
    "SLURM_NODELIST": "gpu-[01-02]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NODELIST": "gpu-[01-02]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_NTASKS": "2",
    "SLURM_NPROCS": "2",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_GPUS_ON_NODE": "8",
    "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    "SLURMD_NODENAME": "gpu-02",
}

# sbatch -N2 --ntasks-per-node=8 --gres=gpu:8 (seed 004's option 3): task 11 = node 1, GPU 3.
ONE_TASK_PER_GPU = ONE_TASK_PER_NODE | {
    "SLURM_STEP_NUM_TASKS": "16",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
    "SLURM_NTASKS": "16",
    "SLURM_NPROCS": "16",
    "SLURM_TASKS_PER_NODE": "8(x2)",
    "SLURM_NTASKS_PER_NODE": "8",
    "SLURM_PROCID": "11",
    "SLURM_LOCALID": "3",
}


def test_detect():
    assert slurm.detect(ONE_TASK_PER_NODE) == "SLURM_JOB_ID and SLURM_STEP_NODELIST set"
    assert slurm.detect({"SLURM_JOB_ID": "1"}) is None  # salloc shell without a node list
    assert slurm.detect({}) is None


def test_one_task_per_node():
    r = slurm.read(ONE_TASK_PER_NODE)
    assert (r.nnodes.value, r.node_rank.value) == (2, 1)
    assert r.master_addr.value == "gpu-01"
    assert str(r.master_addr.source) == "first host of SLURM_STEP_NODELIST"
    assert r.spawn.value is True and r.rank is None
    assert r.gpus_per_node.value == 8 and str(r.gpus_per_node.source) == "env SLURM_GPUS_ON_NODE"
    assert r.hosts == ("gpu-01", "gpu-02")
    # No MASTER_PORT: derived from the job id so two jobs sharing a node do not collide.
    assert r.master_port.value == 15000 + 4242 % 20000


def test_one_task_per_gpu_spawns_nothing():
    r = slurm.read(ONE_TASK_PER_GPU)
    assert r.spawn.value is False
    assert (r.rank.value, r.local_rank.value, r.nproc_per_node.value) == (11, 3, 8)
    assert r.node_rank.value == 1


def test_master_port_from_env_wins():
    assert slurm.read(ONE_TASK_PER_NODE | {"MASTER_PORT": "29600"}).master_port.value == 29600


def test_batch_script_itself_is_noted():
    env = {k: v for k, v in ONE_TASK_PER_NODE.items() if not k.startswith("SLURM_STEP")}
    r = slurm.read(env | {"SLURM_NODEID": "0"})
    assert any("srun" in note for note in r.notes)


def test_tasks_per_node_forms():
    # (tasks, nodes), never expanded: 8(x65536) costs no more than 8(x2).
    assert slurm.tasks_per_node("X", "8(x2),4") == [(8, 2), (4, 1)]
    assert slurm.tasks_per_node("X", "2,2") == [(2, 1), (2, 1)]


@pytest.mark.parametrize(
    ("change", "variable"),
    [
        ({"SLURM_STEP_NODELIST": "gpu-[01-"}, "SLURM_STEP_NODELIST"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID"),
        ({"SLURM_NODEID": "x"}, "SLURM_NODEID"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NODELIST"),
        ({"SLURM_STEP_TASKS_PER_NODE": "8,4"}, "SLURM_STEP_TASKS_PER_NODE"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT"),
    ],
)
def test_bad_values(change, variable):
    with pytest.raises(ConfigError) as err:
        slurm.read(ONE_TASK_PER_NODE | change)
    assert err.value.variable == variable
    assert "\n" not in err.value.line()


# This platform's environments for tests/unit/hostile_env.py's fuzzing: node 1 of a 2-node
# job, one per convention (tests/unit/test_platforms_contract.py checks each detects as this
# platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "slurm": {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-[01-02]",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_STEP_ID": "0",
        "SLURM_GPUS_ON_NODE": "8",
    },
    "slurm-per-gpu": {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_NODELIST": "gpu-[01-02]",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NUM_TASKS": "16",
        "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
        "SLURM_STEP_ID": "0",
    },
}
