"""IPv6 in real containers (issue 24): two node containers on a Docker network with IPv6
enabled (dual-stack, as Docker makes it), the master given as node 0's IPv6 address, or as a
name that resolves to that address only (an /etc/hosts entry, as `--add-host` writes it); the
built-in DeepSpeed job trains across both (gloo over IPv6) with the master bracketed, the form
most likely misread; with the literal and the name, tests/fault_trainer.py's workers do, over
the same torchrun rendezvous (each form is the entrypoint's and torchrun's to read); and a
killed or paused node ends the job as over IPv4 (tests/cluster/test_faults.py; the nodes run
tests/fault_trainer.py there, as the entrypoints, not torch, are the subject)."""

from __future__ import annotations

import ipaddress
import secrets
from typing import Any

import pytest

from entrypoint.local.cluster import Node
from entrypoint.local.cluster_docker import DEFAULT_OUTPUT
from faulty_cluster import (
    LIGHT_MOUNT,
    ONE_PER_NODE,
    Fault,
    FaultyCluster,
    light_started,
    lightened,
)

from .test_faults import HEARTBEAT_TIMEOUT, LOST, measured, took

STEPS = 30
TRAINING = "[job] step 10/"
TIMEOUT = 360
V6_NAME = "master-v6"  # resolves to node 0's IPv6 address only


class V6Cluster(FaultyCluster):
    """A FaultyCluster on an IPv6-enabled network: node i at <subnet>::1<i>, and V6_NAME
    mapped to node 0's address in every node's /etc/hosts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.subnet = f"fd00:{secrets.token_hex(2)}:{secrets.token_hex(2)}::"

    def address(self, index: int) -> str:
        """Node `index`'s address, compressed as the resolver and the plan write it (a group
        `05d5` of a random subnet is `5d5` there)."""
        return ipaddress.ip_address(f"{self.subnet}1{index}").compressed

    def _network_options(self) -> dict[str, Any]:
        from docker.types import IPAMConfig, IPAMPool

        pool = IPAMPool(subnet=f"{self.subnet}/64")
        return {"enable_ipv6": True, "ipam": IPAMConfig(pool_configs=[pool])}

    def _container_options(self, node: Node) -> dict[str, Any]:
        index = int(node.name.rsplit("-", 1)[1])
        endpoint = self.client.api.create_endpoint_config(ipv6_address=self.address(index))
        return {
            "networking_config": {self.network_name: endpoint},
            "extra_hosts": {V6_NAME: self.address(0)},
        }


def nodes(c: V6Cluster, master: str) -> list[Node]:
    return [
        Node(
            c.hostname("node", r),
            {
                "NNODES": "2",
                "NODE_RANK": str(r),
                "MASTER_ADDR": master,
                "MASTER_PORT": "29500",
                "ENTRYPOINT_NPROC_PER_NODE": "2",
                "ENTRYPOINT_JOB_STEPS": str(STEPS),
                "ENTRYPOINT_JOB_LOG_EVERY": "5",
            },
        )
        for r in (0, 1)
    ]


@pytest.mark.parametrize(
    ("form", "light"), [("literal", True), ("bracketed", False), ("name", True)]
)
def test_the_job_trains_with_an_ipv6_master(image, docker_client, form, light):
    mounts = LIGHT_MOUNT if light else {}
    with V6Cluster(image, client=docker_client, echo=print, mounts=mounts) as c:
        master = {"literal": c.address(0), "bracketed": f"[{c.address(0)}]", "name": V6_NAME}
        specs = nodes(c, master[form])
        if light:  # its reports where the built-in job's go
            specs = lightened(specs, STEPS, out=f"{DEFAULT_OUTPUT}/results")
        run = c.run(specs, timeout=TIMEOUT)
        names = [c.hostname("node", r) for r in (0, 1)]
        assert run.exit_codes == {names[0]: 0, names[1]: 0}, run.log(80)
        reports = run.results
        assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
        steps = {r["last_step"] if light else r["steps"] for r in reports}
        assert steps == {STEPS}, reports
        # NCCL_SOCKET_FAMILY=AF_INET6 in the plan, its source said
        assert (
            '"NCCL_SOCKET_FAMILY": "probe: the master\'s address is IPv6 '
            f"({c.address(0)})" in run.node(names[0]).log()
        )


def test_over_ipv6_a_killed_node_and_a_paused_node_end_the_job_as_over_ipv4(image, docker_client):
    for fault in ("kill", "pause"):
        with V6Cluster(image, client=docker_client, echo=print, mounts=LIGHT_MOUNT) as c:
            first, other = c.hostname("node", 0), c.hostname("node", 1)
            action = (lambda c: c.kill(other)) if fault == "kill" else (lambda c: c.pause(other))
            faults = [Fault(fault, action, node=first, line="[fault] step 10/")]
            if fault == "pause":
                faults.append(Fault("unpause", lambda c: c.unpause(other), exited=first))
            run = c.run(
                light_started(c, 5000, master=c.address(0), **ONE_PER_NODE),
                timeout=TIMEOUT,
                grace=90,
                faults=faults,
            )
            want = {first: 75, other: 137 if fault == "kill" else 75}
            assert run.exit_codes == want, run.log(80)
            seconds = took(run, first, fault)
            assert (HEARTBEAT_TIMEOUT - 1 if fault == "pause" else 0) < seconds < LOST
            assert f"lost node 1 ({other})" in run.node(first).log()
            done = {"kill": "killed", "pause": "paused"}[fault]
            measured(f"over IPv6, node 1 {done}: node 0 exited", seconds)
