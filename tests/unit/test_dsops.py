"""The DeepSpeed op check before launch (entrypoint/supervise/dsops.py): which op a config selects,
as DeepSpeed 0.19.8's engine does (deepspeed/runtime/engine.py: _configure_basic_optimizer,
get_optimizer_configuration, zero_use_cpu_optimizer; swap_tensor/* load async_io), which configs a
job uses, and the one line `entrypoint run` prints, through a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint.supervise import dsops
from entrypoint.supervise.dsops import Need

ADAMW = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}
OFF_CPU = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
OFF_NVME = {
    "stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"},
    "offload_param": {"device": "nvme", "nvme_path": "/nvme"},
}

# (case, config, the ops it selects): deepspeed.ai/docs/config-json, HF's ds_config_zero2/3.
CASES = [
    ("no optimizer block: the trainer's own", {"zero_optimization": {"stage": 2}}, []),
    ("HF ZeRO-2, AdamW", {"optimizer": ADAMW, "zero_optimization": {"stage": 2}}, ["fused_adam"]),
    ("Adam, any case", {"optimizer": {"type": "adam"}}, ["fused_adam"]),
    (
        "torch_adam: torch's own",
        {"optimizer": {"type": "Adam", "params": {"torch_adam": True}}},
        [],
    ),
    ("ZeRO-Offload to cpu", {"optimizer": ADAMW, "zero_optimization": OFF_CPU}, ["cpu_adam"]),
    (
        "legacy cpu_offload",
        {"optimizer": ADAMW, "zero_optimization": {"cpu_offload": True}},
        ["cpu_adam"],
    ),
    (
        "ZeRO-Infinity to nvme",
        {"optimizer": ADAMW, "zero_optimization": OFF_NVME},
        ["cpu_adam", "async_io", "async_io"],
    ),
    (
        "nvme params, no optimizer block",
        {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
        ["async_io"],
    ),
    (
        "offload device auto: nothing known",
        {
            "optimizer": {"type": "SGD"},
            "zero_optimization": {"offload_optimizer": {"device": "auto"}},
        },
        [],
    ),
    ("Lamb", {"optimizer": {"type": "Lamb"}}, ["fused_lamb"]),
    ("Lion", {"optimizer": {"type": "Lion"}}, ["fused_lion"]),
    ("Lion offloaded", {"optimizer": {"type": "Lion"}, "zero_optimization": OFF_CPU}, ["cpu_lion"]),
    (
        "Adagrad offloaded",
        {"optimizer": {"type": "Adagrad"}, "zero_optimization": OFF_CPU},
        ["cpu_adagrad"],
    ),
    ("Adagrad on the device: torch's", {"optimizer": {"type": "Adagrad"}}, []),
    ("torch optimizer by name", {"optimizer": {"type": "SGD"}}, []),
    ("Muon's auxiliary Adam", {"optimizer": {"type": "Muon"}}, ["fused_adam"]),
    ("not a mapping where one is expected", {"optimizer": "AdamW", "zero_optimization": [1]}, []),
]

# What the image holds (docker/Dockerfile): the CUDA wheel's ops, the CPU accelerator's cache.
IMAGE = {
    "cuda": frozenset({"fused_adam", "cpu_adam", "async_io", "pin_memory"}),
    "cpu": frozenset({"fused_adam", "cpu_adam", "deepspeed_shm_comm"}),
}


@pytest.mark.parametrize("case, config, ops", CASES, ids=[c[0] for c in CASES])
def test_ops_needed(case, config, ops):
    assert [need.op for need in dsops.ops_needed(config)] == ops


@pytest.mark.parametrize(
    "config, accelerator, missing",
    [
        ({"optimizer": ADAMW}, "cuda", []),
        ({"optimizer": ADAMW}, "cpu", []),
        ({"optimizer": ADAMW, "zero_optimization": OFF_CPU}, "cpu", []),
        ({"optimizer": ADAMW, "zero_optimization": OFF_NVME}, "cuda", []),
        (
            {"optimizer": ADAMW, "zero_optimization": OFF_NVME},
            "cpu",
            [
                Need("zero_optimization.offload_optimizer.device", "nvme", "async_io"),
                Need("zero_optimization.offload_param.device", "nvme", "async_io"),
            ],
        ),
        ({"optimizer": {"type": "Lamb"}}, "cuda", [Need("optimizer.type", "Lamb", "fused_lamb")]),
        ({"optimizer": ADAMW}, "xpu", [Need("optimizer.type", "AdamW", "fused_adam")]),
    ],
)
def test_missing_ops_in_the_image(config, accelerator, missing):
    assert list(dsops.missing_ops(config, IMAGE, accelerator)) == missing


def test_missing_on_a_cuda_only_build():
    """The issue's failure: a wheel built for CUDA only; on CPU nodes fused_adam was JIT-built."""
    cuda_only = {"cuda": IMAGE["cuda"], "cpu": frozenset()}
    assert dsops.missing_ops({"optimizer": ADAMW}, cuda_only, "cpu") == (
        Need("optimizer.type", "AdamW", "fused_adam"),
    )


def test_problem_line_names_file_field_op_and_fix():
    need = Need("optimizer.type", "AdamW", "fused_adam")
    line = dsops.problem_line("ds_config.json", need, IMAGE | {"cpu": frozenset()}, "cpu").line()
    assert line.startswith(
        "ds_config.json: optimizer.type='AdamW': needs DeepSpeed's fused_adam "
        "op for the cpu accelerator"
    )
    assert "(it has: none)" in line and '"torch_adam": true' in line and "\n" not in line


GENERATED = {
    "/run/node0/deepspeed.json": json.dumps({"optimizer": ADAMW}),
    "/run/node0/accelerate.yaml": "deepspeed_config:\n  deepspeed_config_file: "
    "/run/node0/deepspeed.json\n",
}


def _reader(files):
    return lambda path: files.get(path)


@pytest.mark.parametrize(
    "command, uses_generated, files, where",
    [
        (("python", "train.py"), False, {}, []),
        (("python", "train.py"), True, {}, ["/run/node0/deepspeed.json"]),
        (
            ("python", "run_translation.py", "--deepspeed", "ds.json"),
            False,
            {"ds.json": "{}"},
            ["ds.json"],
        ),
        (("python", "train.py", "--deepspeed=ds.json"), False, {"ds.json": "{}"}, ["ds.json"]),
        (
            ("deepspeed", "train.py", "--deepspeed_config", "c.json"),
            False,
            {"c.json": "{}"},
            ["c.json"],
        ),
        (("python", "train.py", "--deepspeed", "missing.json"), False, {}, []),
        (("python", "train.py", "--deepspeed", "--bf16"), False, {}, []),
        (("python", "train.py", "--deepspeed", "not json"), False, {"not json": "x: 1"}, []),
        (
            ("python", "train.py", "--deepspeed", '{"optimizer": {"type": "Adam"}}'),
            False,
            {},
            ["--deepspeed (inline)"],
        ),
        (
            ("accelerate", "launch", "--config_file", "/run/node0/accelerate.yaml", "t.py"),
            False,
            {},
            ["/run/node0/deepspeed.json"],
        ),
        (
            ("accelerate", "launch", "--config_file", "a.yaml", "t.py"),
            False,
            {"a.yaml": "deepspeed_config:\n  offload_param_device: nvme\n"},
            ["a.yaml: deepspeed_config"],
        ),
        (
            ("accelerate", "launch", "--config_file", "a.yaml", "t.py"),
            False,
            {"a.yaml": "distributed_type: MULTI_GPU\n"},
            [],
        ),
    ],
)
def test_configs_of(command, uses_generated, files, where):
    found = dsops.configs_of(command, GENERATED, uses_generated, _reader(files))
    assert [w for w, _ in found] == where


def test_accelerate_inline_offload_needs_async_io():
    found = dsops.configs_of(
        ("accelerate", "launch", "--config_file", "a.yaml", "t.py"),
        {},
        False,
        _reader({"a.yaml": "deepspeed_config:\n  offload_param_device: nvme\n"}),
    )
    assert [n.op for n in dsops.ops_needed(found[0][1])] == ["async_io"]


# -- the edge: DeepSpeed's record of its ops, and `entrypoint run` refusing -------------------


def _fake_deepspeed(root: Path, accelerator: str, ops: dict[str, int]) -> Path:
    """A deepspeed package laid out as setup.py installs it: its record of built ops."""
    package = root / "deepspeed"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('the check must not import it')\n")
    (package / "git_version_info_installed.py").write_text(
        f"version='0.19.8'\ngit_hash='x'\ngit_branch='y'\ninstalled_ops={ops!r}\n"
        f"accelerator_name='{accelerator}'\ntorch_info={{'version': '2.10'}}\n"
    )
    return root


def _probe(root: Path, env: dict[str, str]) -> dict:
    code = (
        "import json, os; from entrypoint.supervise import dsops; "
        "r = dsops.installed_ops(dict(os.environ)); "
        "print(json.dumps(r and {k: sorted(v) for k, v in r.items()}))"
    )
    env = {
        **os.environ,
        **env,
        "PYTHONPATH": os.pathsep.join([str(root), str(Path(dsops.__file__).parents[1])]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout)


def test_installed_ops_read_without_importing_deepspeed(tmp_path):
    root = _fake_deepspeed(
        tmp_path / "site",
        "cuda",
        {"fused_adam": 1, "cpu_adam": 1, "async_io": 1, "fused_lamb": False},
    )
    extensions = tmp_path / "ext"
    for op in ("deepspeed_shm_comm", "fused_adam"):
        (extensions / op).mkdir(parents=True)
        (extensions / op / f"{op}.so").write_bytes(b"")
    (extensions / "half").mkdir()  # a build that never finished: no .so
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ninja").write_text("#!/bin/sh\necho 1.13.2\n")
    (bin_dir / "ninja").chmod(0o755)
    env = {"TORCH_EXTENSIONS_DIR": str(extensions)}
    assert _probe(root, env | {"PATH": str(bin_dir)}) == {
        "cuda": ["async_io", "cpu_adam", "fused_adam"],
        # cpu_adam: the wheel's, which the image's hook shares with the CPU accelerator
        "cpu": ["cpu_adam", "deepspeed_shm_comm", "fused_adam"],
    }
    # DeepSpeed's JIT path asks for ninja before it looks for a prebuilt op; the shared op
    # is the wheel's own, loaded with no JIT path
    assert _probe(root, env | {"PATH": str(tmp_path)})["cpu"] == ["cpu_adam"]


def test_a_cpu_wheel_shares_nothing_and_a_cuda_wheel_only_host_optimizers(tmp_path):
    cpu_wheel = _fake_deepspeed(tmp_path / "cpu", "cpu", {"cpu_adam": 1, "fused_adam": 1})
    assert _probe(cpu_wheel, {}) == {"cuda": [], "cpu": ["cpu_adam", "fused_adam"]}
    cuda_wheel = _fake_deepspeed(tmp_path / "cuda", "cuda", {"fused_adam": 1, "cpu_lion": 1})
    assert _probe(cuda_wheel, {}) == {"cuda": ["cpu_lion", "fused_adam"], "cpu": ["cpu_lion"]}


def test_no_deepspeed_no_check(tmp_path):
    assert _probe(tmp_path, {}) is None


def test_run_refuses_in_one_line_before_launch(tmp_path):
    """`entrypoint run` on a CPU node, a trainer with --deepspeed and AdamW, a DeepSpeed built
    for CUDA only: exit 2, one line naming file, field, op and fix; nothing starts."""
    root = _fake_deepspeed(tmp_path / "site", "cuda", {"fused_adam": 1, "cpu_adam": 1})
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"optimizer": ADAMW, "zero_optimization": {"stage": 2}}))
    marker = tmp_path / "started"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENTRYPOINT_", "DS_"))}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(root), str(Path(dsops.__file__).parents[1])]),
        "ENTRYPOINT_DEVICE": "cpu",
        "ENTRYPOINT_RUN_DIR": str(tmp_path / "run"),
        "ENTRYPOINT_LAUNCHER": "direct",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "entrypoint",
            "run",
            "--",
            sys.executable,
            "-c",
            f"open({str(marker)!r}, 'w')",
            "--deepspeed",
            str(config),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("entrypoint: error:")]
    assert errors == [
        (
            f"entrypoint: error: {config}: optimizer.type='AdamW': needs DeepSpeed's fused_adam op "
            "for the cpu accelerator, which this image does not have prebuilt (it has: cpu_adam) "
            "and "
            'cannot build at start (no compiler). Set "torch_adam": true in optimizer.params '
            "(torch's own Adam, no op), or build the op into an image derived from this one "
            "(docs/IMAGE.md)"
        )
    ], proc.stderr
    assert "Traceback" not in proc.stderr and not marker.exists()
