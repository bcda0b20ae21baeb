import pytest

from entrypoint.plan.facts import Facts, Gpu, Interface


def gpus(n, name="NVIDIA H100 80GB HBM3"):
    return tuple(Gpu(index=i, uuid=f"GPU-{i:04d}", name=name, memory_mib=81559) for i in range(n))


def node(n_gpus=None, *, route="eth0", ib=()):
    """Facts of a typical node: eth0 routes to the master; n_gpus None means not probed."""
    return Facts(
        hostname="node",
        python="/venv/bin/python",
        cpu_count=16,
        gpus=None if n_gpus is None else gpus(n_gpus),
        gpu_probe="not probed" if n_gpus is None else "probe nvml",
        interfaces=(Interface("lo", "127.0.0.1"), Interface("eth0", "10.0.0.2")),
        route_to_master=route,
        default_route="eth0",
        master_ip="10.0.0.1",
        ib_hcas=ib,
    )


@pytest.fixture
def facts():
    return node
