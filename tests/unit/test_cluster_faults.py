"""The cluster helper's fault machinery without Docker: when a Fault fires, what a node with a
shared volume is created with, and reports read once from a shared output (the real runs are
tests/cluster/test_faults.py)."""

import pytest

from entrypoint.local.cluster import ClusterRun, NodeRun
from faulty_cluster import Fault, triggered

STEP_10 = "[job] step 10/"


def runs(**lines) -> dict[str, NodeRun]:
    return {name: NodeRun(name, lines=list(text)) for name, text in lines.items()}


def noop(cluster):
    return None


@pytest.mark.parametrize(
    ("fault", "now", "state", "fires"),
    [
        (Fault("at", noop, at=10), 9.9, runs(n0=[]), False),
        (Fault("at", noop, at=10), 10.0, runs(n0=[]), True),
        # once the job trains: rank 0's step line on node 0, not a line on another node
        (Fault("line", noop, node="n0", line=STEP_10), 1, runs(n0=["[job] step 5/100"]), False),
        (Fault("line", noop, node="n0", line=STEP_10), 1, runs(n0=["[job] step 10/100"]), True),
        (
            Fault("line", noop, node="n0", line=STEP_10),
            1,
            runs(n0=[], n1=["[job] step 10/100"]),
            False,
        ),
        (Fault("line", noop, node="nX", line="x"), 1, runs(n0=["x"]), False),  # no such node
        # after a node exited (unpause the paused one once node 0 gave up on it)
        (Fault("exited", noop, exited="n0"), 1, runs(n0=[]), False),
        (Fault("exited", noop, exited="n0"), 1, {"n0": NodeRun("n0", exit_code=75)}, True),
        (Fault("exited", noop, exited="n0"), 1, {"n0": NodeRun("n0", exit_code=0)}, True),
    ],
)
def test_a_fault_fires_on_its_trigger(fault, now, state, fires):
    assert triggered(fault, now, state) is fires


def test_nodes_of_a_shared_cluster_mount_one_volume_at_the_same_path():
    from entrypoint.local.cluster import Cluster, Node
    from faulty_cluster import FaultyCluster

    class Containers:
        def create(self, image, **kwargs):
            self.kwargs = kwargs

    client = type("Client", (), {"containers": Containers()})()
    Cluster("img", prefix="x", client=client)._create(Node("x-node-0", {}))
    assert client.containers.kwargs["volumes"] is None
    FaultyCluster("img", prefix="x", client=client, shared="/shared")._create(Node("x-node-1", {}))
    assert client.containers.kwargs["volumes"] == {"x-shared": {"bind": "/shared", "mode": "rw"}}
    # a directory of this machine (the user's code), read-only in every node, beside the volume
    FaultyCluster(
        "img", prefix="x", client=client, shared="/shared", mounts={"/src/trainers": "/workspace"}
    )._create(Node("x-node-2", {}))
    assert client.containers.kwargs["volumes"] == {
        "/src/trainers": {"bind": "/workspace", "mode": "ro"},
        "x-shared": {"bind": "/shared", "mode": "rw"},
    }


def test_reports_of_a_shared_output_count_once_per_rank():
    a, b = NodeRun("a", results=[{"rank": 1}, {"rank": 0}]), NodeRun("b", results=[{"rank": 1}])
    run = ClusterRun(nodes=[a, b], lines=[], seconds=1, timed_out=False, killed_after_failure=[])
    assert [r["rank"] for r in run.results] == [0, 1]


def test_when_a_line_arrived():
    node = NodeRun("n0", lines=["a", "[job] step 10/40", "b"], times=[1.0, 2.5, 3.0])
    assert node.when("step 10/") == 2.5 and node.when("missing") is None
