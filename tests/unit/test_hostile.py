"""Hostile input at every boundary between the environment and the plan (issue 15): every case
the issue lists, through the real CLI (`plan`, `doctor`, `run`: exit 2, one line on stderr, no
traceback), the readers' own tables, and hypothesis over the whole path environment -> plan
for every platform convention (tests/unit/hostile_env.py): any environment either plans and
the plan's invariants hold, or is refused with one ConfigError line; never another exception,
never more than a second of CPU.

Render's and config directories' own hostile cases live with them (test_render_*, test_plan).
"""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hostile_env import TEMPLATES, draw, facts, plan_once, violations
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import node
from entrypoint.plan import platforms
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.hostlist import HostlistError, expand
from entrypoint.plan.node_plan import make_plan
from entrypoint.plan.values import NODES, device_list, host, number

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = {
    "PATH": os.environ["PATH"],
    "HOME": os.environ.get("HOME", "/tmp"),
    "PYTHONPATH": REPO,
    "ENTRYPOINT_RUN_DIR": "/tmp/entrypoint-hostile-test",
}
M = {"MASTER_ADDR": "10.0.0.1"}
SLURM = {
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NODELIST": "n[0-1]",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_STEP_ID": "0",
}
NESTED = "[" * 30_000 + "]" * 30_000  # 60 kB: a variable holds at most 128 kB

# (case, environment, the variable the one line names, words it holds). Issue 15's list.
REFUSED = [
    ("RANK superscript two", {"WORLD_SIZE": "2", "RANK": "²"} | M, "RANK", "ASCII digits"),
    (
        "MASTER_PORT superscript two",
        {"WORLD_SIZE": "2", "RANK": "1", "MASTER_PORT": "²"} | M,
        "MASTER_PORT",
        "not a TCP port",
    ),
    (
        "PET_NPROC_PER_NODE superscript two",
        {"NNODES": "2", "NODE_RANK": "1", "PET_NPROC_PER_NODE": "²"} | M,
        "PET_NPROC_PER_NODE",
        "neither a number nor",
    ),
    ("RANK=++1", {"WORLD_SIZE": "2", "RANK": "++1"} | M, "RANK", "no sign"),
    (
        "NNODES in Arabic-Indic digits",
        {"ENTRYPOINT_NNODES": "١٢"},
        "ENTRYPOINT_NNODES",
        "ASCII digits",
    ),
    (
        "SLURM_TASKS_PER_NODE=2(x0)",
        SLURM | {"SLURM_TASKS_PER_NODE": "2(x0)"},
        "SLURM_TASKS_PER_NODE",
        "on 0 nodes",
    ),
    (
        "ENTRYPOINT_PLATFORM=slurm, no SLURM variables",
        {"ENTRYPOINT_PLATFORM": "slurm"},
        "SLURM_JOB_NODELIST",
        "names no node",
    ),
    (
        "SM_HOSTS nested 30000 deep",
        {"SM_HOSTS": NESTED, "SM_CURRENT_HOST": "algo-1"},
        "SM_HOSTS",
        "not a JSON list",
    ),
    (
        "SLURM_JOB_NODELIST=node[0-999999999]",
        {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[0-999999999]"},
        "SLURM_JOB_NODELIST",
        "names 1000000000 hosts, above the limit of 65536",
    ),
    (
        "GPUS_PER_NODE=1000000000",
        {"NNODES": "1", "GPUS_PER_NODE": "1000000000"},
        "GPUS_PER_NODE",
        "above the limit of 256 GPUs per node",
    ),
    (
        "ENTRYPOINT_GPUS_PER_NODE=10**30",
        {"ENTRYPOINT_GPUS_PER_NODE": "1" + "0" * 30},
        "ENTRYPOINT_GPUS_PER_NODE",
        "above the limit of 256",
    ),
    (
        "SLURM_PROCID=16 of 16",
        SLURM | {"SLURM_NTASKS": "16", "SLURM_PROCID": "16", "SLURM_LOCALID": "0"},
        "SLURM_PROCID",
        "below the step's 16 tasks",
    ),
    (
        "SLURM_LOCALID=8 of 8 per node",
        SLURM | {"SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_PROCID": "9", "SLURM_LOCALID": "8"},
        "SLURM_LOCALID",
        "below the 8 tasks per node",
    ),
    (
        "ENTRYPOINT_NNODES=2 without a master",
        {"ENTRYPOINT_NNODES": "2"},
        "MASTER_ADDR",
        "no master address",
    ),
    (
        "MASTER_ADDR=host:port",
        {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.0.0.1:29500"},
        "MASTER_ADDR",
        "holds a port",
    ),
    (
        "MASTER_ADDR=[fe80::1]",
        {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "[fe80::1]"},
        "MASTER_ADDR",
        "a link-local address without its zone",
    ),
    (
        "MASTER_ADDR=[fd00::2]:29500",
        {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "[fd00::2]:29500"},
        "MASTER_ADDR",
        "Set MASTER_ADDR=fd00::2 and the port in MASTER_PORT=29500",
    ),
    (
        "MASTER_ADDR='worker 0'",
        {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "worker 0"},
        "MASTER_ADDR",
        "not one host name",
    ),
    (
        "ENTRYPOINT_MASTER_ADDR=::1:29500",
        {"ENTRYPOINT_MASTER_ADDR": "::1:29500"},
        "ENTRYPOINT_MASTER_ADDR",
        "not a valid IPv6 address",
    ),
    (
        "control port = master port",
        {"WORLD_SIZE": "2", "RANK": "1", "MASTER_PORT": "29500", "ENTRYPOINT_CONTROL_PORT": "29500"}
        | M,
        "ENTRYPOINT_CONTROL_PORT",
        "rendezvous port too",
    ),
    (
        "heartbeat timeout below its interval",
        {"ENTRYPOINT_HEARTBEAT_TIMEOUT": "2"},
        "ENTRYPOINT_HEARTBEAT_TIMEOUT",
        "below 3 x ENTRYPOINT_HEARTBEAT_INTERVAL",
    ),
    (
        "heartbeat interval above a third of the timeout",
        {"ENTRYPOINT_HEARTBEAT_INTERVAL": "20"},
        "ENTRYPOINT_HEARTBEAT_INTERVAL",
        "3 intervals (60 s) exceed",
    ),
    (
        "ENTRYPOINT_JOIN_TIMEOUT=inf",
        {"ENTRYPOINT_JOIN_TIMEOUT": "inf"},
        "ENTRYPOINT_JOIN_TIMEOUT",
        "not a number",
    ),
    (
        "CUDA_VISIBLE_DEVICES=0,0",
        {"CUDA_VISIBLE_DEVICES": "0,0"},
        "CUDA_VISIBLE_DEVICES",
        "names GPU 0 twice",
    ),
    (
        "CUDA_VISIBLE_DEVICES='' with GPUs stated",
        {"CUDA_VISIBLE_DEVICES": "", "ENTRYPOINT_GPUS_PER_NODE": "8"},
        "ENTRYPOINT_GPUS_PER_NODE",
        "hides every GPU",
    ),
    ("WORLD_SIZE=''", {"WORLD_SIZE": "", "RANK": "0"}, "WORLD_SIZE", "set but empty"),
    ("SLURM_NODEID=''", SLURM | {"SLURM_NODEID": ""}, "SLURM_NODEID", "set but empty"),
    (
        "LOCAL_RANK against RANK",
        {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"} | M,
        "LOCAL_RANK",
        "expected 1",
    ),
    (
        "WORLD_SIZE=10**30",
        {"WORLD_SIZE": "1" + "0" * 30, "RANK": "0"} | M,
        "WORLD_SIZE",
        "above the limit of 1048576 processes",
    ),
    (
        "a setting holding a newline",
        {"ENTRYPOINT_SOCKET_IFNAME": "eth0\nlo"},
        "ENTRYPOINT_SOCKET_IFNAME",
        "control character",
    ),
    (
        "a host twice in the node list",
        {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1,n1"},
        "SLURM_JOB_NODELIST",
        "names n1 twice",
    ),
]


def entrypoint(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *args],
        capture_output=True,
        text=True,
        env=BASE | env,
        timeout=120,
        cwd=REPO,
        check=False,
    )


def assert_one_line(out, variable, words):
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert lines[0].startswith(f"entrypoint: error: {variable}="), lines[0][:500]
    assert words in lines[0], lines[0][:500]


@pytest.mark.parametrize(
    ("env", "variable", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_plan_refuses_with_one_line(env, variable, words):
    assert_one_line(entrypoint("plan", env=env), variable, words)


@pytest.mark.parametrize("command", ["doctor", "run"])
def test_doctor_and_run_refuse_the_same_way(command):
    """Every case again, in `doctor` and `run` (concurrently: they only start Python)."""
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda case: entrypoint(command, env=case[1]), REFUSED))
    for (name, _, variable, words), out in zip(REFUSED, outs, strict=True):
        try:
            assert_one_line(out, variable, words)
        except AssertionError as err:
            raise AssertionError(f"{command}, case {name!r}: {err}") from None


def test_master_port_65535_plans_the_control_port_below_it():
    out = entrypoint(
        "plan", "--json", env={"WORLD_SIZE": "2", "RANK": "1", "MASTER_PORT": "65535"} | M
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert (plan["master_port"], plan["control_port"]) == (65535, 65534)


def test_world_size_alone_is_one_machine_with_a_warning():
    out = entrypoint("plan", "--json", env={"WORLD_SIZE": "2"})
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert (plan["platform"], plan["nnodes"]) == ("local", 1)
    assert any("WORLD_SIZE=2 set, but no platform is recognised" in w for w in plan["warnings"])


# -- the same decisions in process, where facts about the node matter --------------------------


def test_empty_cuda_visible_devices_means_no_gpu():
    plan = make_plan({"CUDA_VISIBLE_DEVICES": ""}, node(8), ["python", "t.py"])
    assert plan.device == "cpu" and plan.cuda_visible_devices is None


def test_gpu_uuids_are_kept():
    plan = make_plan({"CUDA_VISIBLE_DEVICES": "GPU-0001,GPU-0003"}, node(8), ["python", "t.py"])
    assert plan.cuda_visible_devices == "GPU-0001,GPU-0003" and plan.gpus_per_node == 2


def test_devices_named_on_a_node_without_gpus_refused():
    with pytest.raises(ConfigError, match="this node has 0"):
        make_plan({"CUDA_VISIBLE_DEVICES": "0"}, node(0), ["python", "t.py"])


def test_nnodes_by_hand_takes_the_master_given():
    plan = make_plan(
        {"ENTRYPOINT_NNODES": "2", "ENTRYPOINT_NODE_RANK": "1"} | M, node(8), ["python", "t.py"]
    )
    assert (plan.nnodes, plan.node_rank, plan.master_addr) == (2, 1, "10.0.0.1")


@pytest.mark.parametrize(
    "setting",
    [{"ENTRYPOINT_NPROC_PER_NODE": "1"}, {"ENTRYPOINT_NNODES": "1", "ENTRYPOINT_NODE_RANK": "0"}],
)
def test_settings_cannot_shrink_a_job_the_platform_started_around_its_rank(setting):
    env = TEMPLATES["mpi"] | setting  # rank 9 of 16, 8 per node, started by mpirun
    with pytest.raises(ConfigError, match="OMPI_COMM_WORLD_RANK='9': is outside the job"):
        make_plan(env, node(8), ["python", "t.py"])


# -- the readers' tables -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [("0", 0), ("7", 7), (" 8 ", 8), ("007", 7), ("65536", 65536), ("0" * 4999 + "1", 1)],
)
def test_number_reads_ascii_digits(raw, value):
    assert number("X", raw, low=0, high=65536) == value


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("²", "ASCII digits"),
        ("١٢", "ASCII digits"),
        ("+1", "no sign"),
        ("-1", "no sign"),
        ("1_000", "ASCII digits"),
        ("1e3", "ASCII digits"),
        ("", "set but empty"),
        ("65537", "above the limit of 65536"),
        ("9" * 5000, "above the limit"),
        ("0", "positive"),
    ],
)
def test_number_refusals_name_the_range(raw, words):
    with pytest.raises(ConfigError) as err:
        number("X", raw, low=1, high=65536)
    assert words in err.value.line() and "\n" not in err.value.line()


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("worker-0", "worker-0"),
        ("10.0.0.1", "10.0.0.1"),
        ("node_1.svc.cluster.local.", "node_1.svc.cluster.local."),
        ("jo-dbxfe2k2l635222i-worker-0", "jo-dbxfe2k2l635222i-worker-0"),
        (" m ", "m"),
    ],
)
def test_host_accepts_names_and_ipv4(raw, value):
    assert host("MASTER_ADDR", raw) == value


@pytest.mark.parametrize(
    ("raw", "ipv6"),
    [
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("fd00::2", "fd00::2"),
        ("[fd00::2]", "fd00::2"),
        ("FD00:0:0::2", "fd00::2"),
        (" [2001:db8::7] ", "2001:db8::7"),
        ("fe80::1%eth0", "fe80::1%eth0"),
        ("[fe80::1%eth0]", "fe80::1%eth0"),
        ("fe80::1%3", "fe80::1%3"),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("[::ffff:10.0.0.1]", "10.0.0.1"),
    ],
)
def test_host_reads_ipv6_in_the_bare_form(raw, ipv6):
    # The plan holds the bare form; launchers add brackets where they write host:port.
    assert host("MASTER_ADDR", raw) == ipv6


def test_a_link_local_without_zone_is_a_host_in_a_list_but_not_a_master():
    assert host("SKYPILOT_NODE_IPS", "fe80::1", master=False) == "fe80::1"
    with pytest.raises(ConfigError) as err:
        host("MASTER_ADDR", "fe80::1")
    assert err.value.line() == (
        "MASTER_ADDR='fe80::1': a link-local address without its zone (the interface that "
        "reaches it). Set MASTER_ADDR=fe80::1%eth0 (this node's interface towards node 0), "
        "or give node 0's global or unique-local address"
    )


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("10.0.0.1:29500", "Set MASTER_ADDR=10.0.0.1 and the port in MASTER_PORT=29500"),
        ("[fd00::2]:29500", "Set MASTER_ADDR=fd00::2 and the port in MASTER_PORT=29500"),
        ("[fe80::1]:29500", "holds a port"),
        ("::1:29500", "not a valid IPv6 address"),
        ("fd00::2::3", "not a valid IPv6 address"),
        ("[fe80::1]", "without its zone"),
        ("fd00::2%eth0", "Set MASTER_ADDR=fd00::2"),
        ("fe80::1%", "a zone"),
        ("fe80::1%" + "e" * 16, "a zone"),
        ("[fd00::2", "not a valid IPv6"),
        ("worker 0", "space"),
        ("tcp://h:1", "a URL"),
        ("1.2.3.256", "not a valid IPv4"),
        ("010.0.0.1", "leading zeros"),
        ("ünï", "ASCII"),
        ("a" * 64, "at most 63"),
        ("-x", "not starting or ending with '-'"),
        ("a,b", "comma"),
        ("host\nevil", "ASCII"),
        ("[node]", "brackets"),
    ],
)
def test_host_refusals_say_what_to_do(raw, words):
    with pytest.raises(ConfigError) as err:
        host("MASTER_ADDR", raw)
    assert words in err.value.line() and "\n" not in err.value.line()


@pytest.mark.parametrize(
    ("raw", "ids"),
    [
        ("", ()),
        ("-1", ()),
        ("0,1", ("0", "1")),
        ("3, 1", ("3", "1")),
        ("02", ("2",)),
        ("GPU-8e1c-aa,MIG-4f/1/0", ("GPU-8e1c-aa", "MIG-4f/1/0")),
    ],
)
def test_device_list_reads_as_cuda_does(raw, ids):
    assert device_list("CUDA_VISIBLE_DEVICES", raw) == ids


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("0,0", "twice"),
        ("00,0", "twice"),
        ("GPU-1,GPU-1", "twice"),
        ("0,,1", "empty entry"),
        ("all", "no GPU at all"),
        ("0,-1", "neither a GPU index nor a UUID"),
        ("256", "above the limit of 255"),
        ("gpu0", "neither"),
        ("²", "neither"),
    ],
)
def test_device_list_refusals(raw, words):
    with pytest.raises(ConfigError) as err:
        device_list("CUDA_VISIBLE_DEVICES", raw)
    assert words in err.value.line()


def test_hostlist_is_counted_before_it_is_expanded():
    started = time.process_time()
    for text in ("node[0-999999999]", "a[0-99999]b[0-99999]", "n[0-65535],m"):
        with pytest.raises(HostlistError, match="above the limit of 65536"):
            expand(text)
    assert time.process_time() - started < 0.5
    assert len(expand(f"n[0-{NODES.high - 1}]")) == NODES.high


def test_every_platform_variable_set_empty_is_refused():
    for name in sorted(platforms.variables()):
        with pytest.raises(ConfigError, match="set but empty"):
            platforms.detect({name: " "})


# -- hypothesis: any environment plans, keeping the invariants, or is refused in one line ------


def _check(env, node, command):
    started = time.process_time()
    try:
        plan = plan_once(env, node, command)
    except ConfigError as err:
        assert "\n" not in err.line(), err.line()
    else:
        assert violations(plan, node) == [], env
    assert time.process_time() - started < 1.0, env


@pytest.mark.parametrize("template", sorted(TEMPLATES))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_environment_plans_or_is_refused_in_one_line(template, data):
    env, node, command = draw(lambda seq: data.draw(st.sampled_from(list(seq))), template)
    _check(env, node, command)


@pytest.mark.parametrize("platform", platforms.ORDER)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_forced_platform_reads_any_environment_or_refuses(platform, data):
    env, node, command = draw(lambda seq: data.draw(st.sampled_from(list(seq))))
    _check(env | {"ENTRYPOINT_PLATFORM": platform}, node, command)


def test_templates_plan_as_they_stand():
    """The starting points are valid: what the properties refuse, a mutation caused."""
    for name, env in TEMPLATES.items():
        plan = plan_once(dict(env), facts(8), ("python", "train.py"))
        assert violations(plan, facts(8)) == [], name
        assert plan.nnodes == (1 if name == "local" else 2), name
