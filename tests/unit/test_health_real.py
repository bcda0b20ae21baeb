"""A sick node is put aside, for real: `entrypoint run` nodes on loopback with real torchrun
workers (tests/fault_trainer.py). What cannot exist here is the GPU: each node imports the
stand-in NVML of tests/stand_in/pynvml.py (2 GPUs each, events and counters written by the test)
instead of nvidia-ml-py; everything else is the entrypoint as shipped. A hung data directory is a
real FUSE mount that never answers; a down NIC is a real veth pair with its peer set down."""

import ctypes
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_spares_real import _finished
from test_supervise_real import Nodes

STAND_IN = str(Path(__file__).parents[1] / "stand_in")
STEPS = "160"


def _gpus(tmp: Path, rank: int) -> dict:
    """Node `rank`'s stand-in GPUs: their directory, and the environment that points at it."""
    where = tmp / f"nvml{rank}"
    where.mkdir(exist_ok=True)
    return {"STAND_IN_NVML_DIR": str(where), "PYTHONPATH": STAND_IN}


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(n, per_node=None, **env):
        c = Nodes(tmp_path, n=n, FAULT_STEPS=STEPS, ENTRYPOINT_GPUS_PER_NODE="2", **env)
        made.append(c)
        for rank in range(n):
            c.start(rank, **_gpus(tmp_path, rank), **(per_node or {}).get(rank, {}))
        return c

    yield make
    for c in made:
        c.kill_everything()


def _wait_for(c: Nodes, rank: int, text: str, within: float) -> float:
    start = time.monotonic()
    while text not in c.log(rank):
        assert time.monotonic() - start < within, c.log(rank)[-3000:]
        time.sleep(0.05)
    return time.monotonic() - start


def _metrics(c: Nodes) -> str:
    url = f"http://127.0.0.1:{c.port + 2}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def test_an_xid_79_puts_the_node_aside_and_the_spare_trains_an_ecc_event_is_counted(cluster):
    c = cluster(3, ENTRYPOINT_SPARES="1")
    c.wait_training(4)
    while not (c.tmp / "out" / "ckpt").exists():
        time.sleep(0.1)
    # not fatal: counted and said once, the job goes on
    with open(c.tmp / "nvml0" / "events", "a") as f:
        f.write("1 xid 92\n")
    _wait_for(c, 0, "GPU 1 XID 92 (high single-bit ECC error rate) (counted", 5)
    scraped = _metrics(c)
    counted = r'multinode_node_health_events_total\{event="xid_92",host="[^"]+",node="0"\} 1\.0'
    assert re.search(counted, scraped), scraped[-3000:]
    # fatal: node 1 is named with the event within 2 s, and the spare takes its seat
    with open(c.tmp / "nvml1" / "events", "a") as f:
        f.write("0 xid 79\n")
    took = _wait_for(c, 0, "GPU 0 XID 79 (fallen off the bus)", 2)
    codes = c.wait()
    assert codes == {0: 0, 1: 75, 2: 0}, c.log(0)[-3000:]
    log = c.log(0)
    line = next(x for x in log.splitlines() if "XID 79" in x)
    assert re.search(r"lost node 1 \([^)]+\): GPU 0 XID 79 \(fallen off the bus\)", line), line
    assert "restart 1: node 2 takes node rank 1" in log
    assert "node 0 took this node out of the job: GPU 0 XID 79" in c.log(1)
    assert "multinode_node_unhealthy" in scraped
    _finished(c, 4, 1)
    print(f"XID 79 named by node 0 {took:.2f} s after it was written")


def _trained(c: Nodes, world: int) -> None:
    """The job trained to its end at its first start, on `world` ranks."""
    reports = c.reports()
    assert [(r["rank"], r["world_size"], r["last_step"], r["restart"]) for r in reports] == [
        (rank, world, int(STEPS), 0) for rank in range(world)
    ], reports


class HungMount:
    """A FUSE mount whose server never answers (not even its INIT): every look at it waits,
    as a hung NFS or FUSE mount's does, until the mount is taken away."""

    def __init__(self, target: Path) -> None:
        self.target = target
        target.mkdir()
        self.fd = os.open("/dev/fuse", os.O_RDWR)
        libc = ctypes.CDLL(None, use_errno=True)
        opts = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0".encode()
        if libc.mount(b"stand-in", str(target).encode(), b"fuse.hung", 0, opts) != 0:
            raise OSError(ctypes.get_errno(), "mount fuse", str(target))

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.target)], check=False)
        os.close(self.fd)


@pytest.fixture
def hung(tmp_path, unavailable):
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        unavailable("a FUSE mount needs root and /dev/fuse")
    mount = HungMount(tmp_path / "hung")
    yield mount.target
    mount.close()


def test_a_hung_data_directory_fails_its_check_in_time_and_the_spare_trains(
    cluster, hung, tmp_path
):
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0").write_text("x")
    c = cluster(3, {1: {"ENTRYPOINT_DATA_DIR": str(hung)}}, ENTRYPOINT_SPARES="1",
                ENTRYPOINT_DATA_DIR=str(data))  # fmt: skip
    codes = c.wait(150)
    assert codes == {0: 0, 1: 75, 2: 0}, c.log(1)[-3000:]
    line = next(x for x in c.log(0).splitlines() if "stands aside" in x)
    assert f"ENTRYPOINT_DATA_DIR={hung}: not readable within 10 s" in line, line
    assert "training on 2 of 2 nodes; 0 standby" in c.log(0)
    assert "health check failed" in c.log(1)
    _trained(c, 4)


def test_without_a_spare_every_node_refuses_in_one_line(cluster, hung):
    c = cluster(2, {1: {"ENTRYPOINT_DATA_DIR": str(hung)}})
    codes = c.wait(60)
    assert codes == {0: 75, 1: 75}, c.log(0)[-3000:]
    for rank in (0, 1):
        said = [x for x in c.log(rank).splitlines() if "not readable within 10 s" in x]
        assert said, c.log(rank)[-2000:]
    stop = next(x for x in c.log(0).splitlines() if "stopping every node" in x)
    assert "node 1 (" in stop and "give the job spares (ENTRYPOINT_SPARES)" in stop, stop
    assert not (c.tmp / "out").exists() or not list((c.tmp / "out").glob("started*"))


@pytest.fixture
def down_link(unavailable):
    """A veth pair, its peer down: `hcdown0` is as a NIC whose cable was pulled."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        unavailable("a veth pair needs root and iproute2")
    name = f"hcd{os.getpid() % 10000}"
    made = subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        unavailable(f"cannot make a veth pair: {made.stderr.strip()}")
    subprocess.run(["ip", "addr", "add", "10.123.45.1/30", "dev", name], check=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    yield name
    subprocess.run(["ip", "link", "del", name], check=False)


def test_a_node_whose_nic_is_down_fails_its_check_and_the_spare_trains(cluster, down_link):
    assert Path(f"/sys/class/net/{down_link}/operstate").read_text().strip() != "up"
    c = cluster(3, {1: {"ENTRYPOINT_SOCKET_IFNAME": down_link}}, ENTRYPOINT_SPARES="1")
    codes = c.wait(150)
    assert codes == {0: 0, 1: 75, 2: 0}, c.log(1)[-3000:]
    line = next(x for x in c.log(0).splitlines() if "stands aside" in x)
    assert f"network interface {down_link}: is lowerlayerdown" in line, line
    _trained(c, 4)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
