"""The plan as a pure function of (environment, facts): no probing, no os.environ."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import node
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.node_plan import BUILTIN_JOB, make_plan
from entrypoint.supervise.preflight import check_hardware

SEED_004_WORKER_1 = {
    "MASTER_ADDR": "jo-dbxfe2k2l635222i-worker-0",
    "MASTER_PORT": "29500",
    "RANK": "1",
    "WORLD_SIZE": "2",
}
CONTRACT = {
    "platform",
    "nnodes",
    "node_rank",
    "nproc_per_node",
    "world_size",
    "master_addr",
    "master_port",
    "spawn",
    "rank",
    "local_rank",
    "device",
    "cuda_visible_devices",
    "config",
    "launcher",
    "command",
    "env",
    "sources",
}


def test_seed_004_two_nodes_of_eight_never_become_one_of_sixteen():
    plan = make_plan(SEED_004_WORKER_1, node(8), ["python", "train.py"])
    assert (plan.nnodes, plan.node_rank, plan.nproc_per_node, plan.world_size) == (2, 1, 8, 16)
    assert plan.cuda_visible_devices == "0,1,2,3,4,5,6,7"
    assert plan.ranks == (8, 15)
    assert plan.config.endswith("/16gpu")
    assert (
        json.loads(plan.files["/tmp/entrypoint-run/node1/deepspeed.json"])[
            "gradient_accumulation_steps"
        ]
        == 2
    )
    assert plan.command[:3] == ("/venv/bin/python", "-m", "torch.distributed.run")
    assert "--nnodes=2" in plan.command and "--node-rank=1" in plan.command
    assert "--nproc-per-node=8" in plan.command
    assert "--master-addr=jo-dbxfe2k2l635222i-worker-0" in plan.command
    assert plan.command[-1] == "train.py"


def test_json_contract_has_every_key():
    data = json.loads(make_plan(SEED_004_WORKER_1, node(8)).to_json())
    assert CONTRACT <= data.keys()
    assert data["trainer"] == list(BUILTIN_JOB)


def test_eight_gpu_config_on_one_node():
    plan = make_plan({}, node(8))
    assert plan.config.endswith("/8gpu") and plan.world_size == 8
    assert (
        json.loads(plan.files["/tmp/entrypoint-run/node0/deepspeed.json"])[
            "gradient_accumulation_steps"
        ]
        == 4
    )


def _ds(plan):
    return json.loads(plan.files[f"/tmp/entrypoint-run/node{plan.node_rank}/deepspeed.json"])


# Any GPU count a node layout can make: (nodes, GPUs per node) -> config, and the split of its
# global batch (train_batch_size, micro batch, accumulation). 256 is kept wherever the world size
# divides it, the micro batch lowered (never raised); otherwise the nearest global batch.
ANY_COUNT = [
    (1, 2, "1gpu", (32, 8, 2)),
    (1, 4, "8gpu", (256, 8, 8)),
    (2, 2, "8gpu", (256, 8, 8)),
    (3, 1, "8gpu", (264, 8, 11)),  # 256 over 3: micro 8 kept, 264 = 8 x 11 x 3
    (3, 4, "16gpu", (288, 8, 3)),  # 12 GPUs: 288 = 8 x 3 x 12
    (3, 8, "16gpu", (192, 8, 1)),  # 24 GPUs: 192 = 8 x 1 x 24
    (4, 8, "16gpu", (256, 8, 1)),
    (8, 8, "16gpu", (256, 4, 1)),  # 64 GPUs: micro 8 would make 512; 4 keeps 256
    (100, 1, "16gpu", (300, 3, 1)),  # 100 GPUs: 8 x 100 overshoots; micro 3 is nearest
    (128, 8, "16gpu", (1024, 1, 1)),  # 1024 GPUs: one sample each is the least there is
]


@pytest.mark.parametrize("nnodes,per_node,config,split", ANY_COUNT)
def test_any_gpu_count_plans_for_the_builtin_job(nnodes, per_node, config, split):
    env = {
        "NNODES": str(nnodes),
        "NODE_RANK": "0",
        "MASTER_ADDR": "m",
        "ENTRYPOINT_GPUS_PER_NODE": str(per_node),
    }
    plan = make_plan(env, node())
    ds = _ds(plan)
    assert plan.config.endswith("/" + config) and plan.world_size == nnodes * per_node
    assert (
        ds["train_batch_size"],
        ds["train_micro_batch_size_per_gpu"],
        ds["gradient_accumulation_steps"],
    ) == split
    assert split[0] == split[1] * split[2] * plan.world_size
    assert config in str(plan.sources["config"]) and "train_batch_size" in plan.sources
    with open(plan.config + "/deepspeed.json") as f:
        changed = split[0] != json.load(f)["train_batch_size"]
    assert any("nearest" in w for w in plan.warnings) == changed


def test_every_gpu_count_from_1_to_1024_plans():
    for total in range(1, 1025):
        per_node = 8 if total % 8 == 0 else 1
        env = {
            "NNODES": str(total // per_node),
            "NODE_RANK": "0",
            "MASTER_ADDR": "m",
            "ENTRYPOINT_GPUS_PER_NODE": str(per_node),
        }
        ds = _ds(make_plan(env, node()))
        assert ds["train_batch_size"] == (
            ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * total
        )


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 5, 16, 17, 64])
def test_any_cpu_worker_count_plans(workers):
    env = {"WORLD_SIZE": str(workers), "RANK": "0", "MASTER_ADDR": "m"}
    for trainer in (None, ["python", "train.py"]):
        plan = make_plan(env, node(0), trainer)
        ds = _ds(plan)
        assert plan.config.endswith("/cpu")
        assert ds["train_batch_size"] == (
            ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * workers
        )


def test_a_gpu_node_planned_on_a_cpu_machine():
    env = SEED_004_WORKER_1 | {"ENTRYPOINT_GPUS_PER_NODE": "8"}
    plan = make_plan(env, node(0))
    assert plan.device == "cuda" and plan.config.endswith("/16gpu") and plan.world_size == 16


def _fixed_config(tmp_path, accumulation=4):
    (tmp_path / "deepspeed.json").write_text(
        json.dumps(
            {
                "train_batch_size": 64,
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": accumulation,
            }
        )
    )
    return str(tmp_path)


def test_a_fixed_split_that_cannot_hold_is_refused_for_the_builtin_job(tmp_path):
    env = {
        "NNODES": "1",
        "ENTRYPOINT_GPUS_PER_NODE": "4",
        "ENTRYPOINT_CONFIG": _fixed_config(tmp_path),
    }
    with pytest.raises(ConfigError) as err:
        make_plan(env, node())
    line = err.value.line()
    assert err.value.variable == "ENTRYPOINT_CONFIG" and "only for world size 8, not 4" in line
    plan = make_plan(env, node(), ["python", "train.py"])  # your own trainer: a note
    assert any("does not fit" in n for n in plan.notes)
    assert make_plan(env | {"ENTRYPOINT_GPUS_PER_NODE": "8"}, node()).world_size == 8


def test_named_config_wins():
    plan = make_plan(
        {
            "ENTRYPOINT_CONFIG": "8gpu",
            "GPUS_PER_NODE": "4",
            "NNODES": "2",
            "NODE_RANK": "0",
            "MASTER_ADDR": "m",
        },
        node(),
    )
    assert (
        plan.config.endswith("/8gpu")
        and str(plan.sources["config"]) == "env ENTRYPOINT_CONFIG=8gpu"
    )


def test_cpu_when_no_gpu():
    plan = make_plan({}, node(0), ["python", "t.py"])
    assert plan.device == "cpu" and plan.cuda_visible_devices is None
    assert plan.env["DS_ACCELERATOR"] == "cpu" and plan.env["JAX_PLATFORMS"] == "cpu"
    assert plan.config.endswith("/cpu") and plan.nproc_per_node == 1
    assert "--standalone" in plan.command and plan.master_port is None


def test_explicit_settings_beat_platform_values():
    env = SEED_004_WORKER_1 | {
        "ENTRYPOINT_NNODES": "4",
        "ENTRYPOINT_MASTER_ADDR": "10.9.9.9",
        "ENTRYPOINT_NPROC_PER_NODE": "2",
        "ENTRYPOINT_MASTER_PORT": "1234",
    }
    plan = make_plan(env, node(8), ["x"])
    assert (plan.nnodes, plan.master_addr, plan.master_port, plan.nproc_per_node) == (
        4,
        "10.9.9.9",
        1234,
        2,
    )
    assert str(plan.sources["nnodes"]) == "env ENTRYPOINT_NNODES"
    assert plan.cuda_visible_devices == "0,1"


def test_cuda_visible_devices_restricts_the_node():
    plan = make_plan({"CUDA_VISIBLE_DEVICES": "2,3"}, node(8), ["python", "t.py"])
    assert plan.gpus_per_node == 2 and plan.cuda_visible_devices == "2,3"
    assert str(plan.sources["cuda_visible_devices"]) == "env CUDA_VISIBLE_DEVICES"


def test_nvidia_visible_devices_uuids_restrict_the_probe():
    plan = make_plan({"NVIDIA_VISIBLE_DEVICES": "GPU-0001,GPU-0003"}, node(4), ["python", "t.py"])
    assert plan.cuda_visible_devices == "1,3"


def test_more_workers_than_gpus_refused():
    with pytest.raises(ConfigError) as err:
        make_plan({"ENTRYPOINT_NPROC_PER_NODE": "16"}, node(8), ["x"])
    assert err.value.line().startswith(
        "ENTRYPOINT_NPROC_PER_NODE='16': asks for 16 GPU workers but this node has 8 GPUs"
    )


def test_stated_gpus_checked_against_probe_at_run():
    env = {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "m", "GPUS_PER_NODE": "16"}
    plan = make_plan(env, node(8), ["x"])  # as `run` makes it: probed, but stated wins
    with pytest.raises(ConfigError) as err:
        check_hardware(plan, env, node(8))
    assert err.value.line().startswith("GPUS_PER_NODE='16': asks for 16 GPUs but this node has 8")


def test_promised_gpus_but_none_visible():
    env = {"NNODES": "1", "GPUS_PER_NODE": "8"}
    plan = make_plan(env, node(0), ["x"])
    with pytest.raises(ConfigError) as err:
        check_hardware(plan, env, node(0))
    assert "sees none" in err.value.line() and "--gpus all" in err.value.line()


def test_device_cuda_without_gpus_refused():
    with pytest.raises(ConfigError, match="ENTRYPOINT_DEVICE='cuda'"):
        make_plan({"ENTRYPOINT_DEVICE": "cuda"}, node(0))


def test_several_nodes_need_a_master():
    with pytest.raises(ConfigError) as err:
        make_plan({"NNODES": "2", "NODE_RANK": "1"}, node(8), ["x"])
    assert err.value.line().startswith("MASTER_ADDR=(unset): 2 nodes but no master address")


def test_network_interface_and_user_nccl_settings_win():
    plan = make_plan(
        SEED_004_WORKER_1 | {"GLOO_SOCKET_IFNAME": "ib0"}, node(8, ib=("mlx5_0", "mlx5_1")), ["x"]
    )
    assert plan.env["NCCL_SOCKET_IFNAME"] == "eth0" and "GLOO_SOCKET_IFNAME" not in plan.env
    assert str(plan.sources["GLOO_SOCKET_IFNAME"]) == "env GLOO_SOCKET_IFNAME (set by you, kept)"
    assert plan.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert plan.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_every_node_records_its_collectives_gpu_nodes_dump_nccls_on_a_timeout():
    plan = make_plan(SEED_004_WORKER_1, node(8), ["x"])
    assert plan.env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert plan.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert plan.env["TORCH_FR_DUMP_TEMP_FILE"].endswith("/flight-recorder/rank_")
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in plan.env  # deprecated: torch warns on every rank
    assert "Flight Recorder" in str(plan.sources["TORCH_FR_BUFFER_SIZE"])
    cpu = make_plan(SEED_004_WORKER_1, node(0), ["x"])
    # gloo's collectives recorded (torch 2.10 records none without it), read on a hang; no dump
    assert cpu.env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert "TORCH_FR_DUMP_TEMP_FILE" not in cpu.env and "TORCH_NCCL_DUMP_ON_TIMEOUT" not in cpu.env
    assert "read when the ranks stop stepping" in str(cpu.sources["TORCH_FR_BUFFER_SIZE"])


@pytest.mark.parametrize("name", ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"])
def test_a_flight_recorder_buffer_set_under_either_name_is_kept(name):
    plan = make_plan(SEED_004_WORKER_1 | {name: "50"}, node(8), ["x"])
    assert "TORCH_FR_BUFFER_SIZE" not in plan.env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in plan.env
    assert str(plan.sources[name]) == f"env {name} (set by you, kept)"
    assert plan.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


@pytest.mark.parametrize("name", ["TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"])
def test_a_dump_file_set_under_either_name_is_kept(name):
    """torch reads the new name first: setting it over your old one would move your dumps."""
    plan = make_plan(SEED_004_WORKER_1 | {name: "/mine/trace_"}, node(8), ["x"])
    assert "TORCH_FR_DUMP_TEMP_FILE" not in plan.env
    assert str(plan.sources[name]) == f"env {name} (set by you, kept)"


def test_never_loopback_or_docker_bridge_between_nodes():
    plan = make_plan(SEED_004_WORKER_1 | {"RANK": "0"}, node(8, route="lo"), ["x"])
    assert plan.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert "default route" in str(plan.sources["NCCL_SOCKET_IFNAME"])
    plan = make_plan(SEED_004_WORKER_1, node(8, route="docker0"), ["x"])
    assert plan.env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_single_node_sets_no_interface():
    assert "NCCL_SOCKET_IFNAME" not in make_plan({}, node(8), ["x"]).env


def test_one_process_per_gpu_platform_execs_directly():
    env = {
        "WORLD_SIZE": "16",
        "RANK": "11",
        "LOCAL_RANK": "3",
        "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "m",
        "MASTER_PORT": "29500",
    }
    plan = make_plan(env, node(8), ["python", "train.py"])
    assert (plan.spawn, plan.launcher, plan.rank, plan.local_rank) == (False, "direct", 11, 3)
    assert plan.command == ("/venv/bin/python", "train.py")
    assert plan.env["RANK"] == "11" and plan.env["WORLD_SIZE"] == "16"
    assert plan.cuda_visible_devices == "0,1,2,3,4,5,6,7"  # LOCAL_RANK indexes into them


def test_jax_one_process_per_node_owns_all_gpus():
    env = SEED_004_WORKER_1 | {"ENTRYPOINT_LAUNCHER": "jax"}
    plan = make_plan(env, node(8), ["python", "train_jax.py"])
    assert (plan.nproc_per_node, plan.world_size) == (1, 2)
    assert plan.env["JAX_COORDINATOR_ADDRESS"] == "jo-dbxfe2k2l635222i-worker-0:29500"
    assert plan.env["JAX_PROCESS_ID"] == "1" and plan.env["JAX_NUM_PROCESSES"] == "2"
    assert plan.env["JAX_LOCAL_DEVICE_IDS"] == "0,1,2,3,4,5,6,7"
    assert plan.config.endswith("/16gpu")  # chosen by devices, not processes
    assert plan.command == ("/venv/bin/python", "train_jax.py")


def test_accelerate_config_written_for_this_node():
    env = SEED_004_WORKER_1 | {"ENTRYPOINT_LAUNCHER": "accelerate"}
    plan = make_plan(env, node(8), ["python", "train.py"])
    import yaml

    acc = yaml.safe_load(plan.files["/tmp/entrypoint-run/node1/accelerate.yaml"])
    assert (acc["num_machines"], acc["num_processes"], acc["machine_rank"]) == (2, 16, 1)
    assert acc["main_process_ip"] == "jo-dbxfe2k2l635222i-worker-0"
    ds = "/tmp/entrypoint-run/node1/accelerate-deepspeed.json"
    assert acc["deepspeed_config"]["deepspeed_config_file"] == ds
    # the trainer brings its optimizer and scheduler; accelerate refuses one in the file too
    assert (
        "optimizer" not in json.loads(plan.files[ds])
        and json.loads(plan.files[ds])["train_batch_size"]
        == json.loads(plan.files[ds.replace("accelerate-", "")])["train_batch_size"]
    )
    assert plan.command[1:5] == (
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        "/tmp/entrypoint-run/node1/accelerate.yaml",
    )


@pytest.mark.parametrize(
    ("trainer", "tail"),
    [
        (["python", "train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
        (["python", "-m", "pkg.train"], ["--module", "pkg.train"]),
        (["train.py"], ["train.py"]),
        (["bash", "go.sh"], ["--no-python", "bash", "go.sh"]),
    ],
)
def test_torchrun_trainer_forms(trainer, tail):
    assert list(make_plan({}, node(1), trainer).command[-len(tail) :]) == tail


def test_plan_is_frozen():
    plan = make_plan({}, node(1))
    with pytest.raises(AttributeError):
        plan.nnodes = 3
    with pytest.raises(TypeError):
        plan.env["X"] = "1"


def test_seed_004_sixteen_gpu_list_on_an_eight_gpu_node_refused():
    env = SEED_004_WORKER_1 | {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(16)))}
    with pytest.raises(ConfigError) as err:
        make_plan(env, node(8), ["x"])
    assert err.value.line().startswith(
        "CUDA_VISIBLE_DEVICES='0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15': "
        "names GPU 8,9,10,11,12,13,14,15 but this node has 8 (probe nvml)"
    )


def test_stated_count_wider_than_visible_refused():
    with pytest.raises(
        ConfigError, match="GPUS_PER_NODE='8': but env CUDA_VISIBLE_DEVICES leaves 4"
    ):
        make_plan(
            {"NNODES": "1", "GPUS_PER_NODE": "8", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, node(), ["x"]
        )


def test_control_port_is_the_master_port_plus_one_unless_set():
    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "29600"}
    assert make_plan(env, node(8)).control_port == 29601
    assert make_plan(env | {"ENTRYPOINT_CONTROL_PORT": "40000"}, node(8)).control_port == 40000
    assert make_plan({}, node(1)).control_port is None  # one node: any free port on loopback


def test_collective_timeout_reaches_deepspeed_in_minutes_and_yours_is_kept():
    env = {"NNODES": "1", "ENTRYPOINT_COLLECTIVE_TIMEOUT": "90"}
    plan = make_plan(env, node(8))
    assert (plan.env["ENTRYPOINT_COLLECTIVE_TIMEOUT"], plan.env["DEEPSPEED_TIMEOUT"]) == ("90", "2")
    assert "DEEPSPEED_TIMEOUT" not in make_plan(env | {"DEEPSPEED_TIMEOUT": "5"}, node(8)).env
    plan = make_plan({"ENTRYPOINT_LAUNCHER": "accelerate"}, node(8), ["python", "train.py"])
    assert any("InitProcessGroupKwargs" in w for w in plan.warnings)


@pytest.mark.parametrize(
    "trainer, args",
    [
        (["python", "train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
        (["python", "-m", "pkg.train"], ["--module", "pkg.train"]),
        (["python", "-c", "print(1)"], ["--no-python", "/venv/bin/python", "-c", "print(1)"]),
        (["python", "-u", "train.py"], ["--no-python", "/venv/bin/python", "-u", "train.py"]),
        (["bash", "-c", "echo hi"], ["--no-python", "bash", "-c", "echo hi"]),
    ],
)
def test_trainer_commands_reach_torchrun_as_it_takes_them(trainer, args):
    plan = make_plan({}, node(2), trainer)
    assert list(plan.command[-len(args) :]) == args


@pytest.mark.parametrize(
    "launcher,env",
    [
        ("jax", {"ENTRYPOINT_LAUNCHER": "jax"}),
        (
            "direct",
            {
                "SLURM_JOB_ID": "7",
                "SLURM_JOB_NODELIST": "n[1-2]",
                "SLURM_NNODES": "2",
                "SLURM_NODEID": "1",
                "SLURM_NTASKS": "16",
                "SLURM_TASKS_PER_NODE": "8(x2)",
                "SLURM_PROCID": "9",
                "SLURM_LOCALID": "1",
                "SLURM_GPUS_ON_NODE": "8",
            },
        ),
    ],
)
def test_jax_distributed_initialize_needs_no_arguments(launcher, env):
    """The plan gives JAX the process count and id, and the site hook that hands them over."""
    base = SEED_004_WORKER_1 if launcher == "jax" else {}
    plan = make_plan(base | env | {"PYTHONPATH": "/mine"}, node(8), ["python", "t.py"])
    assert plan.launcher == launcher
    hook, mine = plan.env["PYTHONPATH"].split(":")
    assert hook.endswith("entrypoint/trainer_side/site-hook") and mine == "/mine"
    assert (Path(hook) / "sitecustomize.py").is_file()
    world, rank = (2, "1") if launcher == "jax" else (16, "9")
    assert plan.env["JAX_NUM_PROCESSES"] == str(world) and plan.env["JAX_PROCESS_ID"] == rank
    assert plan.env["JAX_LOCAL_DEVICE_IDS"] == ("0,1,2,3,4,5,6,7" if launcher == "jax" else "1")


@pytest.mark.parametrize(
    ("variable", "raw", "bare"),
    [
        ("MASTER_ADDR", "fd00::1", "fd00::1"),
        ("MASTER_ADDR", "[fd00::1]", "fd00::1"),
        ("MASTER_ADDR", "fe80::1%eth0", "fe80::1%eth0"),
        ("ENTRYPOINT_MASTER_ADDR", "[FD00::1]", "fd00::1"),
    ],
)
def test_an_ipv6_master_is_planned_bare_and_bracketed_where_a_port_follows(variable, raw, bare):
    env = SEED_004_WORKER_1 | {"ENTRYPOINT_LAUNCHER": "jax", variable: raw}
    plan = make_plan(env, node(8), ["python", "t.py"])
    assert plan.master_addr == bare
    assert plan.env["JAX_COORDINATOR_ADDRESS"] == f"[{bare}]:29500"


def test_torchrun_and_accelerate_take_an_ipv6_master_bare():
    # torchrun's --master-addr and accelerate's main_process_ip take the bare address; only a
    # host:port (JAX_COORDINATOR_ADDRESS, the rendezvous shown) brackets it.
    env = SEED_004_WORKER_1 | {"MASTER_ADDR": "[fd00::1]"}
    plan = make_plan(env, node(8), ["python", "t.py"])
    assert "--master-addr=fd00::1" in plan.command
    accelerate = make_plan(env | {"ENTRYPOINT_LAUNCHER": "accelerate"}, node(8), ["t.py"])
    (config,) = [text for path, text in accelerate.files.items() if path.endswith(".yaml")]
    assert json.loads(config.split("\n", 1)[1])["main_process_ip"] == "fd00::1"


@pytest.mark.parametrize(
    ("master_ip", "env", "family", "source"),
    [
        ("fd00::1", {}, "AF_INET6", "the master's address is IPv6 (fd00::1)"),
        ("fd00::1", {"NCCL_SOCKET_FAMILY": "AF_INET"}, "AF_INET", "set by you, kept"),
        ("10.0.0.1", {}, None, None),
    ],
)
def test_nccl_talks_ipv6_when_the_master_is_ipv6(master_ip, env, family, source):
    facts = replace(node(8), master_ip=master_ip)
    plan = make_plan(SEED_004_WORKER_1 | env, facts, ["python", "t.py"])
    assert plan.env.get("NCCL_SOCKET_FAMILY", env.get("NCCL_SOCKET_FAMILY")) == family
    if source is None:
        assert "NCCL_SOCKET_FAMILY" not in plan.sources
    else:
        assert source in str(plan.sources["NCCL_SOCKET_FAMILY"])


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate", "jax"])
def test_every_trainer_starts_with_the_site_hook(launcher):
    env = SEED_004_WORKER_1 | {"ENTRYPOINT_LAUNCHER": launcher}
    plan = make_plan(env, node(0), ["python", "t.py"])
    assert plan.env["PYTHONPATH"].endswith("entrypoint/trainer_side/site-hook")
    assert plan.env["DS_ACCELERATOR"] == "cpu"  # what accelerate_cpu keys on
