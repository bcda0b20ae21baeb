"""Node 0's /metrics text from a Conductor's state (entrypoint.metrics.collector), and `entrypoint
status` reading it back (entrypoint.doctor.status): per-node GPU figures combined over the node's
GPUs, states, the job's series, no secret; the real servers are in test_status_real.py and
tests/cluster/test_metrics.py."""

from prometheus_client import generate_latest
from test_conductor import joined
from test_slow_nodes import Nvml

from entrypoint.control.messages import Beat
from entrypoint.doctor import status
from entrypoint.metrics import collector as metrics
from entrypoint.supervise.gpu_stats import Stats

JOB = metrics.Job("train", "kubernetes", 8)


def text_of(c, clock=lambda: 100.0) -> str:
    return generate_latest(metrics.registry(c, JOB, clock)).decode()


def test_gpu_figures_per_node_and_the_job():
    c = joined(2)
    eight = tuple(str(i) for i in range(8))
    c.beat(0, Beat(Stats(eight, nvml=Nvml()).read()), now=90.0)
    c.beat(1, Beat(Stats(eight, nvml=Nvml(throttled=True)).read()), now=95.0)
    text = text_of(c)
    assert 'multinode_node_gpus{host="worker-0",node="0"} 8.0' in text
    assert 'multinode_node_gpu_utilization_percent{host="worker-1",node="1"} 61.0' in text
    assert 'multinode_node_gpu_power_watts{host="worker-0",node="0"} 5520.0' in text
    assert 'multinode_node_gpu_sm_clock_min_hertz{host="worker-1",node="1"} 1.215e+09' in text
    assert 'multinode_node_gpu_clock_event_reasons{host="worker-1",node="1"} 64.0' in text
    assert 'multinode_node_gpu_temperature_max_celsius{host="worker-1",node="1"} 91.0' in text
    assert 'multinode_node_last_heartbeat_seconds{host="worker-1",node="1"} 5.0' in text
    assert (
        "ecc"
        not in text.split("# HELP multinode_node_gpu_ecc")[1].split("# HELP")[0].split("\n", 2)[2]
    )  # no GPU gave it: no sample
    assert 'multinode_job_info{job="train",platform="kubernetes"} 1.0' in text
    assert "multinode_job_world_size 16.0" in text
    assert 'multinode_job_phase{phase="run"} 1.0' in text

    job = status.read(text)
    assert status.health(job) == (status.HEALTHY, [])
    row = job["members"][1]
    assert (row["gpus"], row["gpu_utilization_percent"], row["state"]) == (8, 61.0, "training")
    table = status.table(job, "http://x/metrics")
    assert "   1     1  worker-1                 training    5 s ago       61%" in table
    assert "560.0/640 GiB" in table


def test_a_lost_node_is_down_and_the_job_degraded():
    c = joined(2)
    c.job.lost[1] = "its connection closed"
    c.job.members[1].connected = False
    text = text_of(c)
    assert 'multinode_node_up{host="worker-1",node="1"} 0.0' in text
    assert 'multinode_node_state{host="worker-1",node="1",state="lost"} 1.0' in text
    assert 'multinode_node_rank{host="worker-1",node="1"} -1.0' in text
    code, why = status.health(status.read(text))
    assert code == status.DEGRADED and why == [
        "lost: node 1 (worker-1)",
        "training on 1 of 2 nodes",
    ]


def test_status_targets():
    env = {"MASTER_ADDR": "fd00::2", "MASTER_PORT": "65535"}
    assert status.target(None, env) == "http://[fd00::2]:65533/metrics"
    assert status.target("node-0:9400", {}) == "http://node-0:9400/metrics"
    assert status.target("[fd00::2]:9400", {}) == "http://[fd00::2]:9400/metrics"
    assert status.target(None, {"ENTRYPOINT_METRICS_PORT": "9400"}) == (
        "http://127.0.0.1:9400/metrics"
    )
    assert status.target("http://h:1/metrics", {}) == "http://h:1/metrics"
