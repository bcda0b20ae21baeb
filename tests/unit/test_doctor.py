"""`entrypoint doctor`: problems found from stated facts (GPU nodes included, no GPU needed),
the report's shapes, and the command through a real subprocess."""

import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import node
from entrypoint.doctor.doctor_checks import Findings, Port, port_meaning, problems
from entrypoint.doctor.doctor_report import report, table
from entrypoint.plan.facts import Facts, Interface
from entrypoint.plan.node_plan import make_plan
from entrypoint.plan.settings import Settings
from entrypoint.supervise.report import table as plan_table

WORKER = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "node-0", "MASTER_PORT": "29500"}
MASTER = WORKER | {"NODE_RANK": "0"}
# What doctor finds on a healthy H100 node of the image (torch 2.10 + CUDA 12.8, driver 570).
GPU_OK = Findings(
    os="Debian GNU/Linux 13 (trixie)",
    python="3.13.5",
    torch="2.10.0+cu128",
    cuda_runtime="12.8",
    torch_gpus=8,
    nccl="2.27.5",
    jax="0.8.0",
    jax_devices="gpu x8",
    deepspeed="0.19.8",
    driver="570.124.06",
    driver_cuda="12.8",
    shm_bytes=64 << 30,
    memlock_bytes=None,
)
CPU_OK = Findings(
    torch="2.10.0+cu128", cuda_runtime="12.8", jax="0.8.0", jax_devices="cpu x1", shm_bytes=2 << 30
)
LINE = re.compile(r"^[^:]+: .+\. [A-Z].*[^.]$")  # `<what>: <problem>. <Fix>`


def found_for(env, facts, findings, **ports):
    plan = make_plan(env, facts)
    port_list = (
        tuple(
            Port(name, var, port, ports.get(name, "refused"))
            for name, var, port in (
                ("rendezvous", "MASTER_PORT", plan.master_port),
                ("control", "ENTRYPOINT_CONTROL_PORT", plan.control_port),
            )
        )
        if plan.nnodes > 1
        else ()
    )
    findings = replace(findings, ports=port_list)
    return plan, problems(plan, facts, findings, Settings.from_env(env)), findings


def test_healthy_gpu_worker_has_no_problem():
    _, found, _ = found_for(WORKER, node(8), GPU_OK, rendezvous="open", control="open")
    assert found == []


def test_healthy_single_cpu_node_has_no_problem():
    _, found, _ = found_for({"ENTRYPOINT_GPUS_PER_NODE": "0"}, node(0), CPU_OK)
    assert found == []


@pytest.mark.parametrize(
    "findings, facts, expect",
    [
        (
            replace(GPU_OK, driver="470.82", driver_cuda="11.4", torch_gpus=0),
            node(8),
            "NVIDIA driver 470.82: runs CUDA up to 11.4, older than this image's CUDA 12.8 "
            "(torch's). Install driver 525.60.13 or newer",
        ),
        (
            replace(GPU_OK, driver="570.86.15", driver_cuda="12.8", cuda_runtime="13.0"),
            node(8),
            "NVIDIA driver 570.86.15: runs CUDA up to 12.8, older than this image's CUDA 13.0 "
            "(torch's). Install driver 580.65.06 or newer; or run the CUDA 12 image on this "
            "node (make image CUDA=12)",
        ),
        (
            replace(GPU_OK, torch_gpus=0),
            node(8),
            "torch 2.10.0+cu128: sees no GPU although the driver lists 8",
        ),
        (replace(GPU_OK, jax_devices="cpu x1"), node(8), "JAX 0.8.0: sees only cpu x1"),
        (
            replace(GPU_OK, jax_devices=None, jax_error="RuntimeError: CUDA_ERROR_OUT_OF_MEMORY"),
            node(8),
            "JAX 0.8.0: jax.devices() failed (RuntimeError: CUDA_ERROR_OUT_OF_MEMORY)",
        ),
        (
            replace(GPU_OK, torch=None, torch_error="ImportError: libcudnn.so.9"),
            node(8),
            "torch: does not import (ImportError: libcudnn.so.9)",
        ),
        (replace(GPU_OK, shm_bytes=64 << 20), node(8), "/dev/shm: 64 MiB"),
        (
            replace(GPU_OK, memlock_bytes=64 << 10),
            node(8, ib=("mlx5_0",)),
            "ulimit -l (locked memory): 0 MiB with InfiniBand mlx5_0",
        ),
        (GPU_OK, replace(node(8), master_ip=None), "MASTER_ADDR=node-0: does not resolve"),
        (
            GPU_OK,
            replace(node(8), route_to_master="lo", default_route="docker0"),
            "network interface: none found",
        ),
    ],
)
def test_each_problem_is_found_with_its_fix(findings, facts, expect):
    _, found, _ = found_for(WORKER, facts, findings, rendezvous="open", control="open")
    assert len(found) == 1 and found[0].startswith(expect), found
    assert LINE.match(found[0]), found[0]


def test_a_port_that_times_out_names_both_ports_to_open():
    _, found, _ = found_for(WORKER, node(8), GPU_OK, rendezvous="timeout", control="timeout")
    assert found[0].startswith("MASTER_PORT=29500: no answer within 2 s from node-0 (10.0.0.1)")
    assert "Open TCP ports 29500 and 29501 on node 0" in found[0]
    assert found[1].startswith("ENTRYPOINT_CONTROL_PORT=29501: no answer")
    assert all(LINE.match(line) for line in found)


def test_nothing_listening_is_fine_before_node_0_starts():
    _, found, _ = found_for(WORKER, node(8), GPU_OK, rendezvous="refused", control="refused")
    assert found == []
    meaning, bad = port_meaning(Port("rendezvous", "MASTER_PORT", 29500, "refused"), node0=True)
    assert not bad and "this is node 0" in meaning
    meaning, bad = port_meaning(Port("rendezvous", "MASTER_PORT", 29500, "refused"), node0=False)
    assert not bad and "has not started" in meaning


def test_settings_that_name_missing_things():
    env = WORKER | {"ENTRYPOINT_SOCKET_IFNAME": "ib9", "ENTRYPOINT_DATA_DIR": "/data/set"}
    _, found, _ = found_for(
        env,
        node(8),
        replace(GPU_OK, health=("ENTRYPOINT_DATA_DIR=/data/set: not readable: FileNotFoundError",)),
        rendezvous="open",
        control="open",
    )
    assert [line.split(":")[0] for line in found] == [
        "ENTRYPOINT_DATA_DIR=/data/set",
        "ENTRYPOINT_SOCKET_IFNAME=ib9",
    ]
    assert "it has lo, eth0" in found[1]


def test_report_and_table():
    plan, found, findings = found_for(
        MASTER, node(8), GPU_OK, rendezvous="refused", control="refused"
    )
    rep = report(plan, node(8), findings, Settings.from_env(MASTER), found)
    assert json.loads(json.dumps(rep))["ok"] is True
    assert rep["software"]["nccl"] == "2.27.5" and len(rep["gpus"]["devices"]) == 8
    assert rep["master"]["this_node"] and not any(p["problem"] for p in rep["master"]["ports"])
    assert rep["network"]["chosen"] == "eth0"
    text = table(rep, plan_table(plan))
    flat = " ".join(text.split())
    for expected in (
        "torch 2.10.0+cu128 (CUDA runtime 12.8), GPUs seen: 8",
        "NCCL 2.27.5",
        "driver 570.124.06 (CUDA 12.8)",
        "GPU 7 NVIDIA H100 80GB HBM3, 81559 MiB",
        "NCCL/gloo use eth0 [probe: routes to the master (10.0.0.1)]",
        "rendezvous port 29500: not listening yet: this is node 0",
        "problems: none",
    ):
        assert expected in flat, text


def test_no_interface_facts_still_render():
    facts = Facts(interfaces=(Interface("lo", "127.0.0.1"),))
    plan, found, findings = found_for({"ENTRYPOINT_GPUS_PER_NODE": "0"}, facts, CPU_OK)
    text = table(report(plan, facts, findings, Settings(), found), plan_table(plan))
    assert "loopback (single node)" in text and "single node: nothing to reach" in text


# -- the command, as a platform starts it ---------------------------------------------------

BASE = {
    "PATH": os.environ["PATH"],
    "HOME": os.environ.get("HOME", "/tmp"),
    "ENTRYPOINT_GPUS_PER_NODE": "0",
}


def doctor(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", "doctor", *args],
        capture_output=True,
        text=True,
        env=BASE | env,
        timeout=120,
    )


def test_json_exit_code_follows_the_problems_and_no_secret_shows():
    secret = "s3cr3t-master-host"  # a secret that also appears as a value doctor reports
    env = WORKER | {"MASTER_ADDR": secret, "DB_PASSWORD": secret}
    out = doctor("--json", env=env)
    rep = json.loads(out.stdout)
    assert out.returncode == (1 if rep["problems"] else 0), out.stderr
    assert rep["node"]["node_rank"] == 1 and rep["master"]["resolved"] is None
    assert any(p.startswith("MASTER_ADDR=***: does not resolve") for p in rep["problems"])
    assert out.returncode == 1 and secret not in out.stdout + out.stderr


def test_table_on_a_single_node():
    out = doctor(env={})
    assert out.returncode in (0, 1), out.stderr
    assert out.stdout.startswith("entrypoint doctor: node 0 of 1")
    for section in (
        "\nsystem\n",
        "\nsoftware\n",
        "\nGPUs\n",
        "\nnetwork\n",
        "\nmaster\n",
        "\nplan\n",
        "\nproblems",
    ):
        assert section in out.stdout
    assert (out.returncode == 0) == ("problems: none" in out.stdout)


def test_gpus_promised_but_not_seen_is_a_problem_in_the_report_not_a_refusal():
    """Issue 25: doctor is where a user finds out that the GPUs are missing; `run` refuses."""
    out = doctor("--json", env={"ENTRYPOINT_GPUS_PER_NODE": "2"})
    assert out.returncode == 1, out.stderr
    rep = json.loads(out.stdout)
    (problem,) = [p for p in rep["problems"] if "sees none" in p]
    assert problem.startswith("ENTRYPOINT_GPUS_PER_NODE='2': promises 2 GPUs but this container")
    assert "--gpus all" in problem and rep["ok"] is False
    table_out = doctor(env={"ENTRYPOINT_GPUS_PER_NODE": "2"})
    assert table_out.returncode == 1 and "promises 2 GPUs" in table_out.stdout
    allreduce = doctor("--allreduce", env={"ENTRYPOINT_GPUS_PER_NODE": "2"})
    assert allreduce.returncode == 1 and "promises 2 GPUs" in allreduce.stdout


def test_configuration_error_exits_2_with_the_same_line_as_run():
    out = doctor(env={"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "m"})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("entrypoint: error: RANK='2': must be below WORLD_SIZE=2")


@pytest.mark.parametrize(
    "args, line",
    [
        (["--sizes", "1,x"], "--sizes='1,x': not a list of positive MiB figures"),
        (["--iters", "0"], "--iters='0': must be at least 1"),
        (["--iters", "10001"], "--iters='10001': must be at least 1 and at most 10,000"),
        (["--sizes", "nan"], "--sizes='nan': not a list of positive MiB figures"),
        (["--sizes", "inf"], "--sizes='inf': not a list of positive MiB figures"),
        (["--sizes", "1,-inf"], "--sizes='1,-inf': not a list of positive MiB figures"),
        (["--sizes", "95TiB"], "--sizes='95TiB': not a list of positive MiB figures"),
        (["--sizes", "100000000"], "--sizes='100000000': not a list of positive MiB figures"),
        (["--sizes", "65537"], "--sizes='65537': not a list of positive MiB figures"),
        (["--sizes", "1_0"], "--sizes='1_0': not a list of positive MiB figures"),
        (["--sizes", "١"], "--sizes='١': not a list of positive MiB figures"),
        (["--sizes", ",".join("1" * 33)], "(at most 32, each at most 65,536)"),
    ],
)
def test_allreduce_options_checked_before_anything_starts(args, line):
    out = doctor("--allreduce", *args, env={})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("entrypoint: error: --") and line in out.stderr
    assert len(out.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "findings, shown",
    [
        (
            replace(GPU_OK, jax_devices=None, jax_error="RuntimeError: busy"),
            "JAX 0.8.0, devices: none (RuntimeError: busy)",
        ),
        (
            replace(GPU_OK, jax=None, jax_devices=None, jax_error="ImportError: x"),
            "JAX does not import (ImportError: x)",
        ),
        (replace(GPU_OK, jax=None, jax_devices=None), "JAX not installed"),
        (replace(GPU_OK, torch=None, torch_error="ImportError: y"), "torch does not import"),
    ],
)
def test_table_rows_when_a_library_fails(findings, shown):
    plan, found, findings = found_for(WORKER, node(8), findings, rendezvous="open", control="open")
    text = table(report(plan, node(8), findings, Settings.from_env(WORKER), found), "")
    assert shown in " ".join(text.split())


def test_an_ipv6_master_is_resolved_and_its_ports_probed_over_ipv6():
    with socket.socket(socket.AF_INET6) as listening:
        listening.bind(("::1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        env = WORKER | {"MASTER_ADDR": "[::1]", "MASTER_PORT": str(port)}
        out = doctor("--json", env=env)
    rep = json.loads(out.stdout)
    assert out.returncode in (0, 1), out.stderr
    assert rep["master"]["resolved"] == "::1", rep["master"]
    states = {p["name"]: p["state"] for p in rep["master"]["ports"]}
    assert states["rendezvous"] == "open", rep["master"]
    assert states["control"] in ("refused", "open"), rep["master"]
