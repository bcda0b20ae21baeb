"""`entrypoint render --spares S --min-nodes M` (issue 22): every platform's spec starts N+S
nodes that plan as N training and S standing by, lets the platform replace a lost node, says so
in its header, validates against the schemas, and refuses what the nodes would refuse."""

import kubernetes_validate
import pytest
import yaml
from render_cases import rendered
from test_render_roundtrip import PLATFORMS
from test_render_schemas import CASES, crd_validator

from conftest import node
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.node_plan import make_plan
from entrypoint.render import render
from entrypoint.render.request import build

IMAGE = "ghcr.io/example/multinode:1.0"


@pytest.mark.parametrize("target", sorted(PLATFORMS))
def test_every_platform_starts_the_spares_and_they_plan_as_standbys(target):
    platform, _, runtime = target.partition("-")
    request = build(
        platform,
        nodes="2",
        spares="1",
        min_nodes="1",
        gpus_per_node="8",
        image=IMAGE,
        master_addr="10.0.0.1" if platform == "docker" else None,
        runtime=runtime or None,
    )
    spec = render(request)
    envs = PLATFORMS[target](spec)[0]
    assert len(envs) == 3
    plans = [make_plan(env, node(8)) for env in envs]
    assert [(p.members, p.member, p.standby) for p in plans] == [
        (3, 0, False),
        (3, 1, False),
        (3, 2, True),
    ]
    assert {(p.nnodes, p.spares, p.min_nodes, p.world_size) for p in plans} == {(2, 1, 1, 16)}
    # 3 nodes: the job's own etcd holds node 0's seat, and a survivor takes it over
    assert "When a node dies:" in spec and "node 0's loss costs a restart" in spec


@pytest.mark.parametrize(
    "nodes, spares, env, survives",
    [
        ("2", "1", (), True),  # the job's own etcd, on 3 nodes
        ("4", "1", (), True),  # on 5 of them
        ("1", "1", (), False),  # 2 nodes: no etcd of its own
        ("1", "1", ("ENTRYPOINT_ETCD=http://etcd.example:2379",), True),
        ("2", "1", ("ENTRYPOINT_ETCD=off",), False),
    ],
)
@pytest.mark.parametrize("target", sorted(PLATFORMS))
def test_where_a_survivor_takes_node_0s_seat_the_platform_brings_node_0_back_as_a_standby(
    target, nodes, spares, env, survives
):
    """A spec says what losing node 0 costs, as node 0 itself says at the start; where a
    survivor takes the seat, the platforms that restart a pod restart node 0's too (it joins
    the new node 0 as a standby, told by its knock), and the others say what they do."""
    platform, _, runtime = target.partition("-")
    request = build(
        platform,
        nodes=nodes,
        spares=spares,
        gpus_per_node="8",
        image=IMAGE,
        master_addr="10.0.0.1" if platform == "docker" else None,
        runtime=runtime or None,
        env=env,
    )
    spec = render(request)
    assert ("node 0's loss costs a restart" in spec) == survives, spec
    if survives and not env:
        assert f"the job's own etcd, on {3 if nodes == '2' else 5} of its nodes" in spec, spec
    assert ("node 0's loss ends the job on every node (75)" in spec) != survives, spec
    if platform == "docker":
        assert ("docker run --restart on-failure --name train-node0" in spec) == survives
    if platform == "volcano":
        master = yaml.safe_load(spec)["spec"]["tasks"][0]
        restarts = [p for p in master["policies"] if p["action"] == "RestartTask"]
        assert bool(restarts) == survives, master


def test_without_spares_the_specs_fail_fast_as_before():
    assert "backoffLimit: 0" in rendered("kubernetes.yaml")
    assert "backoffLimitPerIndex" not in rendered("kubernetes.yaml")
    assert "--no-kill" not in rendered("slurm-pyxis.sbatch")
    assert "--restart" not in rendered("docker.sh")


@pytest.mark.parametrize(
    "case, words",
    [
        ("kubernetes-spares.yaml", ["backoffLimitPerIndex: 3", "podReplacementPolicy: Failed"]),
        ("pytorchjob-spares.yaml", ["restartPolicy: OnFailure", "backoffLimit: 10"]),
        ("volcano-spares.yaml", ["action: RestartTask", "minAvailable: 3"]),
        ("slurm-pyxis-spares.sbatch", ["#SBATCH --no-kill", "#SBATCH --nodes=3"]),
        ("docker-spares.sh", ["docker run --restart on-failure --name train-node2", "NNODES=3"]),
        ("trainjob-spares.yaml", ["numNodes: 3", "JobSet"]),
    ],
)
def test_each_spec_lets_its_platform_replace_a_lost_node(case, words):
    spec = rendered(case)
    for word in words:
        assert word in spec, word


def test_the_kubernetes_spec_validates_from_1_29_on():
    for document in yaml.safe_load_all(rendered("kubernetes-spares.yaml")):
        for version in ("1.29", kubernetes_validate.utils.latest_version()):
            kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_crd_specs_validate(kind):
    (document,) = yaml.safe_load_all(rendered(CASES[kind].replace(".yaml", "-spares.yaml")))
    assert [e.message for e in crd_validator(kind).iter_errors(document)] == []


@pytest.mark.parametrize(
    "options, option",
    [
        ({"spares": "-1"}, "--spares"),
        ({"spares": "x"}, "--spares"),
        ({"spares": "10**30"}, "--spares"),
        ({"min_nodes": "0"}, "--min-nodes"),
        ({"min_nodes": "3"}, "--min-nodes"),  # more than --nodes: every node would refuse it
        ({"env": ["ENTRYPOINT_SPARES=1"]}, "--env"),
        ({"env": ["ENTRYPOINT_MIN_NODES=1"]}, "--env"),
    ],
)
def test_what_a_node_would_refuse_is_refused_in_one_line(options, option):
    with pytest.raises(ConfigError) as err:
        build("kubernetes", nodes="2", gpus_per_node="8", image=IMAGE, **options)
    assert err.value.variable == option and "\n" not in str(err.value)


def test_the_command_line_in_the_header_renders_the_same_spec_again():
    request = build(
        "kubernetes", nodes="2", spares="1", min_nodes="1", gpus_per_node="8", image=IMAGE
    )
    assert "--spares 1 --min-nodes 1" in request.command_line()
    assert "--env ENTRYPOINT_SPARES" not in request.command_line()
