"""`render` wires node 0's /metrics (issue 25): the port the nodes derive, a named container
port, scrape annotations only on a template that node 0's pod alone uses, a PodMonitor in the
opening comment, and --env ENTRYPOINT_METRICS_PORT honoured (0: nothing wired)."""

import pytest
import yaml

from conftest import node
from entrypoint.cli import main
from entrypoint.plan.node_plan import make_plan
from entrypoint.render import render
from entrypoint.render.request import build

IMAGE = "ghcr.io/example/multinode:1.0"


def spec(platform, *env, **options):
    text = render(
        build(platform, nodes="3", gpus_per_node="8", image=IMAGE, env=list(env), **options)
    )
    return text, [d for d in yaml.safe_load_all(text) if d]


def pod_templates(doc):
    if doc["kind"] == "Job" and doc["apiVersion"] == "batch/v1":
        return {"node": doc["spec"]["template"]}
    if doc["kind"] == "PyTorchJob":
        return {k: v["template"] for k, v in doc["spec"]["pytorchReplicaSpecs"].items()}
    return {t["name"]: t["template"] for t in doc["spec"]["tasks"]}


def metrics_ports(template):
    return [
        p["containerPort"]
        for c in template["spec"]["containers"]
        for p in c.get("ports", [])
        if p["name"] == "metrics"
    ]


@pytest.mark.parametrize(
    ("platform", "env", "port"),
    [
        ("kubernetes", {"MASTER_PORT": "29500"}, 29502),
        ("pytorchjob", {"MASTER_PORT": "23456"}, 23458),
        ("volcano", {"MASTER_PORT": "23456"}, 23458),
    ],
)
def test_the_port_is_the_one_node_0_serves(platform, env, port):
    plan = make_plan(env | {"NNODES": "3", "NODE_RANK": "0", "MASTER_ADDR": "m"}, node(8))
    assert plan.metrics_port == port
    text, docs = spec(platform)
    templates = pod_templates(docs[-1])
    node0 = next(iter(templates.values()))
    assert metrics_ports(node0) == [port]
    assert f"serves every node's health at :{port}/metrics" in text
    assert "kind: PodMonitor" in text and "podMetricsEndpoints: [{port: metrics" in text


@pytest.mark.parametrize("platform", ["pytorchjob", "volcano"])
def test_annotations_on_node_0_s_template_alone(platform):
    _, docs = spec(platform)
    master, worker = pod_templates(docs[-1]).values()
    assert master["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "23458",
        "prometheus.io/path": "/metrics",
    }
    assert "metadata" not in worker and metrics_ports(worker) == []


def test_an_indexed_job_has_no_annotations_its_podmonitor_selects_pod_0():
    text, docs = spec("kubernetes")
    assert "metadata" not in pod_templates(docs[-1])["node"]
    assert "batch.kubernetes.io/job-completion-index: '0'" in text


def test_a_port_given_with_env_and_metrics_off():
    text, docs = spec("kubernetes", "ENTRYPOINT_METRICS_PORT=9400")
    assert metrics_ports(pod_templates(docs[-1])["node"]) == [9400]
    assert ":9400/metrics" in text
    text, docs = spec("volcano", "ENTRYPOINT_METRICS_PORT=0")
    master = next(iter(pod_templates(docs[-1]).values()))
    assert metrics_ports(master) == [] and "metadata" not in master
    assert "Metrics: off (ENTRYPOINT_METRICS_PORT=0)." in text and "PodMonitor" not in text


def test_scripts_say_where_node_0_serves():
    text = render(
        build("docker", nodes="2", gpus_per_node="8", image=IMAGE, master_addr="10.0.0.1")
    )
    assert "http://10.0.0.1:29502/metrics" in text and "entrypoint status 10.0.0.1:29502" in text
    text = render(build("slurm", nodes="2", gpus_per_node="8", image=IMAGE))
    assert "its log names the port" in text


def test_a_bad_metrics_port_is_refused_in_one_line(capsys):
    argv = ["render", "kubernetes", "--nodes", "2", "--gpus-per-node", "8", "--image", IMAGE]
    assert main([*argv, "--env", "ENTRYPOINT_METRICS_PORT=x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ENTRYPOINT_METRICS_PORT='x'" in err, err
