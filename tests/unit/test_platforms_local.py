"""The single machine: what `local` reads when no platform variable is set, and one node of
several started by hand (ENTRYPOINT_NNODES, ENTRYPOINT_NODE_RANK, MASTER_ADDR)."""

from entrypoint.plan.platforms import local

# This platform's environments for tests/unit/hostile_env.py's fuzzing (tests/unit/
# test_platforms_contract.py checks each detects as this platform).
EXAMPLES: dict[str, dict[str, str]] = {
    "local": {},
}


def test_nothing_set_is_one_machine_naming_no_job():
    r = local.read({})
    assert r.platform == "local" and r.nnodes.value == 1 and r.node_rank.value == 0
    assert r.warnings == () and local.job_identity({}) == ""


def test_a_variable_of_a_multi_node_job_alone_is_one_machine_with_a_warning():
    r = local.read({"WORLD_SIZE": "16"})
    assert r.nnodes.value == 1
    assert r.warnings and "WORLD_SIZE=16 set, but no platform is recognised" in r.warnings[0]
