"""Health as tables (entrypoint.supervise.health_rules, the Conductor's health events): what each
XID, counter or link change means, what node 0 does with a fatal event or a failed check with
and without spares, and the checks' edges against files and the stand-in NVML; the real nodes
are in test_health_real.py."""

import importlib.util
import os
import time
from pathlib import Path

import pytest
from test_seating import LIMITS, hello, logs, sent, started

from entrypoint.control.actions import Close
from entrypoint.control.messages import BadMessage, Go, Health, Restart, Stop, decode, encode
from entrypoint.coordinator.conductor import Conductor
from entrypoint.coordinator.roster import Roster, seat
from entrypoint.plan.errors import EXIT_PEERS
from entrypoint.supervise import health
from entrypoint.supervise.health_rules import (
    GpuReading,
    driver_misfit,
    gpu_changes,
    is_up,
    link_changes,
    torch_cuda,
    xid_event,
)

STAND_IN = Path(__file__).parents[1] / "stand_in" / "pynvml.py"


@pytest.mark.parametrize(
    "xid, fatal, words",
    [
        (79, True, "fallen off the bus"),
        (48, True, "double-bit ECC"),
        (95, True, "uncontained ECC"),
        (94, False, "contained ECC"),
        (74, True, "NVLink"),
        (119, True, "GSP RPC timeout"),
        (154, True, "recovery action"),
        (13, False, "graphics engine exception"),
        (31, False, "page fault"),
        (9999, False, "XID catalog"),
    ],
)
def test_xids(xid, fatal, words):
    event = xid_event("3", xid)
    assert event.fatal is fatal and words in event.text
    assert event.text.startswith(f"GPU 3 XID {xid} (") and event.kind == f"xid_{xid}"


def test_gpu_counters_and_links():
    before = GpuReading(ecc_uncorrected=2, remap_failed=False, remap_pending=False,
                        nvlinks_up=frozenset({0, 1, 2}))  # fmt: skip
    assert gpu_changes("0", before, before) == []
    now = GpuReading(ecc_uncorrected=5, remap_failed=True, remap_pending=True,
                     nvlinks_up=frozenset({0, 2}))  # fmt: skip
    got = {e.kind: e for e in gpu_changes("0", before, now)}
    assert set(got) == {"ecc_uncorrected", "remap_failed", "remap_pending", "nvlink_down"}
    assert "3 new uncorrected ECC" in got["ecc_uncorrected"].text
    assert not got["ecc_uncorrected"].fatal and not got["remap_pending"].fatal
    assert got["remap_failed"].fatal and got["nvlink_down"].fatal
    assert got["nvlink_down"].text == "GPU 0: NVLink 1 went down"
    # a GPU without the figure says nothing
    assert gpu_changes("1", GpuReading(), GpuReading(ecc_uncorrected=9)) == []


def test_links_that_go_down_are_fatal():
    assert is_up("up") and is_up("unknown") and is_up("4: ACTIVE")
    assert not is_up("down") and not is_up("lowerlayerdown") and not is_up("1: DOWN")
    events = link_changes(
        {"eth0": "up", "mlx5_0/1": "4: ACTIVE", "eth1": "down"},
        {"eth0": "down", "mlx5_0/1": "1: DOWN", "eth1": "down"},
    )
    assert [(e.kind, e.where, e.fatal) for e in events] == [
        ("nic_down", "eth0", True),
        ("ib_port_down", "mlx5_0/1", True),
    ]
    assert link_changes({"eth0": "up"}, {})[0].text == "network interface eth0 went gone"


def test_the_plans_links(tmp_path):
    net, ib = tmp_path / "net", tmp_path / "ib"
    for nic in ("eth0", "eth1", "ens5"):
        (net / nic).mkdir(parents=True)
    (ib / "mlx5_0" / "ports" / "1").mkdir(parents=True)
    (ib / "mlx5_0" / "ports" / "2").mkdir(parents=True)
    env = {
        "NCCL_SOCKET_IFNAME": "eth",
        "GLOO_SOCKET_IFNAME": "=ens5",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1:1",
    }
    links = health.plan_links(env, net=str(net), ib=str(ib))
    assert sorted(links) == ["ens5", "eth0", "eth1", "mlx5_0/1", "mlx5_0/2", "mlx5_1/1"]
    assert links["mlx5_0/2"] == f"{ib}/mlx5_0/ports/2/state"
    assert health.plan_links({"NCCL_SOCKET_IFNAME": "^docker,lo"}, net=str(net)) == {}


def test_the_health_message_is_checked():
    message = Health("xid_79", "GPU 0", "GPU 0 XID 79 (fallen off the bus)", True)
    assert decode(encode(message)) == message
    for bad in (
        b'{"t":"health","kind":"x y","where":"","text":"","fatal":true}',
        b'{"t":"health","kind":"xid_79","where":"","text":"","fatal":1}',
        b'{"t":"health","kind":"xid_79","where":"","text":"' + b"a" * 2000 + b'","fatal":true}',
    ):
        with pytest.raises(BadMessage):
            decode(bad)


# -- node 0 -------------------------------------------------------------------------------------

XID79 = Health("xid_79", "GPU 0", "GPU 0 XID 79 (fallen off the bus)", True)


def test_a_fatal_event_hands_the_seat_to_the_spare_at_once():
    c, _ = started(3, 2, 2)
    actions = c.health(1, XID79, now=5.0)
    assert (
        sent(actions, Stop)[1].reason
        == "node 0 took this node out of the job: GPU 0 XID 79 (fallen off the bus)"
    )
    assert Close(1) in actions
    assert "lost node 1 (worker-1): GPU 0 XID 79 (fallen off the bus)" in logs(actions)
    assert isinstance(sent(actions, Restart)[-1], Restart)
    assert c.job.sick == {1: "GPU 0 XID 79 (fallen off the bus)"}
    c.hello(0, hello(0), now=6.0, wall_now=1000.0)
    assert sent(c.hello(2, hello(2), now=6.0, wall_now=1000.0), Go)[2].seat == 1


def test_without_spares_a_fatal_event_stops_the_job_naming_the_node_and_the_fix():
    c = Conductor(2, LIMITS, 0.0)
    for m in range(2):
        c.hello(m, hello(m), now=1.0, wall_now=1000.0)
    (stop,) = [
        a.message
        for a in c.health(1, XID79, now=5.0)
        if isinstance(getattr(a, "message", None), Stop)
    ]
    assert stop.code == EXIT_PEERS
    assert stop.reason.startswith("node 1 (worker-1): GPU 0 XID 79 (fallen off the bus); drain it")
    assert "ENTRYPOINT_SPARES" in stop.reason


def test_an_event_that_is_not_fatal_is_counted_and_said_once():
    c, _ = started(2, 2, 2)
    ecc = Health("xid_92", "GPU 1", "GPU 1 XID 92 (high single-bit ECC error rate)", False)
    assert "counted in /metrics" in logs(c.health(1, ecc, now=5.0))
    assert c.health(1, ecc, now=6.0) == []
    assert c.job.health_events == {(1, "xid_92"): 2} and c.job.phase == "run" and not c.job.sick


def test_a_node_failing_its_check_stands_aside_and_the_spare_trains():
    c = Conductor(3, LIMITS, 0.0, roster=Roster(3, 2, 2))
    c.hello(0, hello(0), now=1.0, wall_now=1000.0)
    sick = hello(1)
    sick = type(sick)(**{**sick.__dict__, "unhealthy": "ENTRYPOINT_DATA_DIR=/data: not readable"})
    actions = c.hello(1, sick, now=1.0, wall_now=1000.0)
    assert "it stands aside" in logs(actions) and Close(1) in actions
    assert sent(actions, Stop)[1].code == EXIT_PEERS
    go = sent(c.hello(2, hello(2), now=1.0, wall_now=1000.0), Go)
    assert (go[0].seat, go[2].seat) == (0, 1) and c.job.phase == "run"
    # serviced, it comes back healthy: it stands by
    assert sent(c.hello(1, hello(1), now=9.0, wall_now=1000.0), Go)[1].standby
    assert 1 not in c.job.sick


def test_without_a_spare_a_failed_check_refuses_the_job():
    c = Conductor(2, LIMITS, 0.0)
    c.hello(0, hello(0), now=1.0, wall_now=1000.0)
    sick = hello(1)
    sick = type(sick)(**{**sick.__dict__, "unhealthy": "GPU 1: held by 1 other process(es)"})
    (stop,) = [a.message for a in c.hello(1, sick, now=1.0, wall_now=1000.0)
               if isinstance(getattr(a, "message", None), Stop)]  # fmt: skip
    assert stop.reason.startswith("node 1 (worker-1): GPU 1: held by 1 other process(es); drain")
    assert c.job.phase == "end"


# -- the checks' edges ----------------------------------------------------------------------------


@pytest.fixture
def nvml(tmp_path, monkeypatch):
    """The stand-in NVML (tests/stand_in/pynvml.py) as a module, over two GPUs in tmp_path."""
    monkeypatch.setenv("STAND_IN_NVML_DIR", str(tmp_path))
    spec = importlib.util.spec_from_file_location("stand_in_pynvml", STAND_IN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checks_pass_on_a_healthy_node(tmp_path, nvml):
    assert health.before_start(("0", "1"), {}, [("ENTRYPOINT_CHECKPOINT_DIR", tmp_path, True)],
                               None, 5, nvml=nvml) == []  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_checks_name_what_failed(tmp_path, nvml):
    (tmp_path / "gpu0.json").write_text('{"remap": [0, 1, 0, 1]}')
    (tmp_path / "gpu1.json").write_text('{"procs": [[4242, 2147483648]]}')
    hook = tmp_path / "site-check"
    hook.write_text("#!/bin/sh\necho checking\necho 'lustre: /scratch not mounted' >&2\nexit 3\n")
    hook.chmod(0o755)
    missing = tmp_path / "nope"
    started_at = time.monotonic()
    failed = health.before_start(
        ("0", "1"), {"lo": "/sys/class/net/lo/operstate", "gone0": str(tmp_path / "gone")},
        [("ENTRYPOINT_DATA_DIR", missing, False)], str(hook), 5, nvml=nvml,
    )  # fmt: skip
    assert time.monotonic() - started_at < 5
    lines = [f.line() for f in failed]
    assert lines[0] == "GPU 0: row remapping failed. the GPU needs service: drain this node"
    assert lines[1].startswith("GPU 1: held by 1 other process(es) (pid 4242; 2048 MiB)")
    assert lines[2].startswith("network interface gone0: is gone")
    assert lines[3].startswith(f"ENTRYPOINT_DATA_DIR={missing}: not readable: FileNotFoundError")
    assert lines[4].startswith(
        f"ENTRYPOINT_HEALTH_CHECK={hook}: exit 3: lustre: /scratch not mounted"
    )


def test_with_one_entrypoint_per_gpu_a_siblings_trainer_is_no_failure(tmp_path, nvml):
    (tmp_path / "gpu0.json").write_text('{"procs": [[4242, 2147483648]]}')
    assert health.before_start(("0",), {}, [], None, 5, nvml=nvml)
    assert health.before_start(("0",), {}, [], None, 5, nvml=nvml, alone=False) == []


def test_a_restart_waits_for_the_last_workers_gpu_memory(tmp_path, nvml):
    held = tmp_path / "gpu0.json"
    held.write_text('{"procs": [[77, 1048576]]}')
    handles = {"0": nvml.nvmlDeviceGetHandleByIndex(0)}
    assert health.gpus_free(nvml, handles, 0)  # at once: held
    pid = os.fork()
    if pid == 0:  # the last start's worker lets go after a second
        time.sleep(1.0)
        held.write_text("{}")
        os._exit(0)
    began = time.monotonic()
    assert health.gpus_free(nvml, handles, 10) == []
    os.waitpid(pid, 0)
    assert 0.9 < time.monotonic() - began < 5


def test_the_watch_reports_an_xid_and_a_link_going_down(tmp_path, nvml):
    state = tmp_path / "operstate"
    state.write_text("up\n")
    got = []
    watch = health.HealthWatch(("0", "1"), {"eth9": str(state)}, got.append, nvml=nvml, every=0.2)
    try:
        (tmp_path / "events").write_text("1 xid 79\n")
        state.write_text("down\n")
        end = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        watch.stop()
    assert sorted((e.kind, e.where) for e in got) == [("nic_down", "eth9"), ("xid_79", "GPU 1")]


# -- spares to the right place ------------------------------------------------------------------


def test_a_lost_seat_goes_to_a_standby_of_its_nvlink_domain():
    roster = Roster(5, 3, 3)  # members 0-2 train, 3 and 4 stand by
    domains = {0: "rackA/1", 1: "rackA/1", 2: "rackB/7", 3: "rackA/1", 4: "rackB/7"}
    previous = {0: 0, 1: 1, 2: 2}
    assert seat(roster, previous, [0, 1, 3, 4], domains) == {0: 0, 1: 1, 4: 2}
    assert seat(roster, previous, [0, 2, 3, 4], domains) == {0: 0, 2: 2, 3: 1}
    # no standby of its domain, or none known: the lowest standby, as before
    assert seat(roster, previous, [0, 1, 3], domains) == {0: 0, 1: 1, 3: 2}
    assert seat(roster, previous, [0, 1, 3, 4]) == {0: 0, 1: 1, 3: 2}


def test_node_0_seats_by_the_domains_the_nodes_said():
    c = Conductor(4, LIMITS, 0.0, roster=Roster(4, 2, 2))
    for m, domain in enumerate(["A/1", "B/2", "A/1", "B/2"]):
        h = hello(m)
        c.hello(m, type(h)(**{**h.__dict__, "domain": domain}), now=1.0, wall_now=1000.0)
    c.health(1, XID79, now=5.0)  # node 1 (domain B) lost: node 3 (B), not node 2 (A)
    for m in (0, 2, 3):
        h = hello(m)
        actions = c.hello(m, type(h)(**{**h.__dict__, "domain": c.job.seen[m].domain}), 6.0, 1000.0)
    assert "node 3 takes node rank 1" in logs(actions)


def test_the_nvlink_domain_from_nvmls_fabric_info(tmp_path, nvml):
    assert health.nvlink_domain(("0",), nvml=nvml) == ""  # an HGX board: no fabric
    (tmp_path / "gpu0.json").write_text('{"fabric": ["00112233445566778899aabbccddeeff", 7]}')
    assert health.nvlink_domain(("0",), nvml=nvml) == "00112233445566778899aabbccddeeff/7"
    assert health.nvlink_domain((), nvml=nvml) == ""


def test_a_replaced_node_that_comes_back_sick_is_refused_and_the_job_goes_on():
    c, _ = started(3, 2, 2)
    c.health(2, XID79, now=5.0)  # the standby is lost; its platform starts it again, still sick
    sick = hello(2)
    sick = type(sick)(**{**sick.__dict__, "unhealthy": "GPU 0: NVML does not find it"})
    actions = c.hello(2, sick, now=9.0, wall_now=1000.0)
    assert "it cannot stand by" in logs(actions) and Close(2) in actions
    assert c.job.phase == "run" and c.job.sick[2] == "GPU 0: NVML does not find it"


def test_a_node_sick_at_its_first_hello_shows_in_metrics_by_its_host():
    from prometheus_client import generate_latest

    from entrypoint.metrics import collector as metrics

    c = Conductor(2, LIMITS, 0.0)
    c.hello(0, hello(0), now=1.0, wall_now=1000.0)
    sick = hello(1)
    c.hello(1, type(sick)(**{**sick.__dict__, "unhealthy": "x"}), now=1.0, wall_now=1000.0)
    text = generate_latest(metrics.registry(c, metrics.Job("j", "p", 1), lambda: 2.0)).decode()
    assert 'multinode_node_unhealthy{host="worker-1",node="1"} 1.0' in text


# -- the driver against the image's CUDA ------------------------------------------------------


def test_torch_cuda_is_read_from_torchs_version_file():
    assert torch_cuda("__version__ = '2.14.1+cu130'\ncuda: Optional[str] = '13.0'\n") == "13.0"
    assert torch_cuda("cuda = '12.8'\n") == "12.8"
    assert torch_cuda("cuda: Optional[str] = None\n") is None
    assert torch_cuda("debug = False\n") is None


@pytest.mark.parametrize(
    "cuda, runtime, want",
    [
        (13000, "13.0", None),
        (13010, "13.0", None),
        (13000, "12.8", None),  # a 580 driver runs the CUDA 12 image
        (12020, "12.8", None),  # a 535 driver (CUDA 12.2) runs 12.8 (same major)
        (12080, "13.0",
         ("runs CUDA up to 12.8, older than this image's CUDA 13.0 (torch's)",
          "install driver 580.65.06 or newer; or run the CUDA 12 image on this node "
          "(make image CUDA=12)")),
        (11040, "12.8",
         ("runs CUDA up to 11.4, older than this image's CUDA 12.8 (torch's)",
          "install driver 525.60.13 or newer")),
    ],
)  # fmt: skip
def test_a_driver_older_than_the_images_cuda_says_which_image_fits(cuda, runtime, want):
    assert driver_misfit(cuda, runtime) == want


def test_the_check_before_start_reads_the_drivers_versions_from_nvml(nvml, monkeypatch):
    assert health.driver_check(nvml, "13.0") is None
    monkeypatch.setenv("STAND_IN_NVML_DRIVER", "570.86.15,12080")
    failed = health.driver_check(nvml, "13.0")
    assert failed.line() == (
        "NVIDIA driver 570.86.15: runs CUDA up to 12.8, older than this image's CUDA 13.0 "
        "(torch's). install driver 580.65.06 or newer; or run the CUDA 12 image on this node "
        "(make image CUDA=12)"
    )
    assert health.driver_check(nvml, "12.8") is None
    # a CPU torch (no CUDA), or no figure from NVML: nothing to compare
    monkeypatch.setattr(health.probe, "image_cuda", lambda: None)
    assert health.driver_check(nvml) is None


def test_image_cuda_reads_the_installed_torch_without_importing_it():
    import torch.version

    assert health.probe.image_cuda() == torch.version.cuda
