"""jax.distributed.initialize() with no arguments: the plan's JAX variables (jax and direct
launchers), else a torchrun worker's own (one JAX process per GPU or CPU worker). JAX itself is
not installed here; the image's tests and tests/cluster/test_ranks.py run it for real."""

from __future__ import annotations

import types

import pytest

from entrypoint.trainer_side import jax_cluster
from entrypoint.trainer_side.world_check import PLAN_VARIABLE

WORKER = {
    PLAN_VARIABLE: "/run/entrypoint/plan.json",
    "TORCHELASTIC_RUN_ID": "job",
    "WORLD_SIZE": "4",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "worker-0",
    "MASTER_PORT": "29500",
}


def test_a_torchrun_worker_is_its_own_process_with_the_gpu_of_its_local_rank():
    assert jax_cluster.from_torchrun(WORKER) == {
        "JAX_NUM_PROCESSES": "4",
        "JAX_PROCESS_ID": "3",
        "JAX_COORDINATOR_ADDRESS": "worker-0:29499",
        "local": "1",
    }


def test_on_cpu_nodes_no_gpu_is_named_and_a_coordinator_given_is_kept():
    env = WORKER | {"JAX_PLATFORMS": "cpu", "JAX_COORDINATOR_ADDRESS": "worker-0:7000"}
    found = jax_cluster.from_torchrun(env)
    assert found is not None
    assert found["local"] == "" and found["JAX_COORDINATOR_ADDRESS"] == "worker-0:7000"


def test_an_ipv6_master_is_bracketed_and_the_lowest_port_goes_up():
    found = jax_cluster.from_torchrun(WORKER | {"MASTER_ADDR": "fd00::2", "MASTER_PORT": "1"})
    assert found is not None and found["JAX_COORDINATOR_ADDRESS"] == "[fd00::2]:4"


@pytest.mark.parametrize(
    "change",
    [
        {PLAN_VARIABLE: ""},  # not under `entrypoint run`
        {"TORCHELASTIC_RUN_ID": None},  # not a torchrun worker: the jax or direct launcher
        {"JAX_PROCESS_ID": "0"},  # the plan wrote JAX's variables itself
        {"RANK": None},
        {"MASTER_PORT": "x"},
    ],
)
def test_anything_else_is_left_to_the_plans_variables_or_to_jax(change):
    env = {k: v for k, v in (WORKER | change).items() if v is not None}
    assert jax_cluster.from_torchrun(env) is None


def _clusters() -> types.ModuleType:
    """What register() needs of jax._src.clusters: a ClusterEnv whose subclasses are listed."""

    class ClusterEnv:
        _cluster_types: list[type] = []

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            cls._cluster_types.append(cls)

    return types.SimpleNamespace(ClusterEnv=ClusterEnv)  # type: ignore[return-value]


def test_the_cluster_answers_from_the_torchrun_worker_and_goes_first(monkeypatch, capsys):
    clusters = _clusters()
    for name in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS", "JAX_PLATFORMS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (WORKER | {"RANK": "0", "LOCAL_RANK": "0"}).items():
        monkeypatch.setenv(name, value)
    found = jax_cluster.register(clusters)
    assert clusters.ClusterEnv._cluster_types[0] is found
    assert found.is_env_present()
    assert found.get_coordinator_address() == "worker-0:29499"
    assert (found.get_process_count(), found.get_process_id()) == (4, 0)
    assert found.get_local_process_id() == 0
    said = capsys.readouterr().err
    assert "4 processes (torchrun's WORLD_SIZE)" in said and "worker-0:29499" in said, said
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert not found.is_env_present()  # the jax launcher's process, before its plan's variables
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "worker-0:29500")
    assert found.is_env_present() and found.get_process_id() == 1
    assert found.get_local_process_id() is None  # the plan's JAX_LOCAL_DEVICE_IDS says
