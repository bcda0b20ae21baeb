"""DeepSpeed ops a job's config needs, checked before launch against the ops this image has.

DeepSpeed builds a missing op just in time (ninja and a compiler, tens of seconds per node)
when the optimizer is created; the image has no compiler, so a config that needs an op the
image lacks would die there, on every rank, in a ninja traceback. `run` says it first.

    ops_needed(config)                     pure: (field, value, op) for each op it selects
    missing_ops(config, installed, accel)  pure: those this accelerator has not got built
    configs_of(command, files, ..., read)  pure given a reader: the configs a job uses
    installed_ops(env)                     edge: DeepSpeed's own record of its built ops
    check(plan, env)                       edge: all of it; raises ConfigError

What counts as installed is what DeepSpeed itself loads without a build (what `ds_report`
reads): the ops setup.py compiled into the wheel (`deepspeed/git_version_info_installed.py`,
used only when their accelerator is the one running, but for the host-side optimizers that
the image's hook shares with the CPU accelerator: trainer_side/prebuilt_ops.py, share) and, on
the CPU accelerator, ops prebuilt into TORCH_EXTENSIONS_DIR (docker/deepspeed_ops.py), which
DeepSpeed loads through its JIT path, so only while `ninja` answers on PATH.

That JIT path takes a lock in the op's directory (torch 2.14 opens `lock` read-write for an
flock) and runs ninja, which finds nothing to do. Where TORCH_EXTENSIONS_DIR is read-only
(`docker run --read-only`, a pod's readOnlyRootFilesystem) the lock cannot be taken, so the
trainer is given a writable copy made of links (trainer_side/prebuilt_ops.py: node.py before
the trainer starts, the image's .pth hook in a process started without `entrypoint run`).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.node_plan import BUILTIN_JOBS, Plan
from entrypoint.trainer_side.prebuilt_ops import SHARED_CPU_OPS

# deepspeed/runtime/config.py's optimizer names; engine._configure_basic_optimizer picks the op.
_ADAM = ("adam", "adamw", "muon")  # muon's auxiliary Adam is FusedAdam or CPUAdam too
_OFFLOAD_DEVICES = ("cpu", "nvme")  # zero_use_cpu_optimizer(): the optimizer steps on the CPU

# What to do instead, per op, when the image lacks it on this accelerator.
_FIXES = {
    "fused_adam": 'set "torch_adam": true in optimizer.params (torch\'s own Adam, no op)',
    "cpu_adam": 'set "torch_adam": true in optimizer.params, or drop the optimizer offload',
    "async_io": 'offload to "cpu" instead of "nvme", or run this job on GPUs',
    "cpu_adagrad": "use Adam or AdamW, or drop the optimizer offload",
    "cpu_lion": "use Adam or AdamW, or drop the optimizer offload",
    "fused_lion": "use Adam or AdamW",
    "fused_lamb": "use Adam or AdamW",
}
_BUILD_FIX = "or build the op into an image derived from this one (docs/IMAGE.md)"


@dataclass(frozen=True)
class Need:
    """One op a config selects, and the field that selects it."""

    field: str  # dotted path in the config, e.g. zero_optimization.offload_param.device
    value: object
    op: str  # DeepSpeed's op name, as ds_report and installed_ops spell it


def _get(config: Mapping, dotted: str) -> object:
    value: object = config
    for key in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _lower(value: object) -> str:
    return value.lower() if isinstance(value, str) else ""


def ops_needed(config: Mapping) -> tuple[Need, ...]:
    """The ops DeepSpeed 0.19's engine loads for this config ("auto" selects nothing)."""
    needs = []
    zero = "zero_optimization"
    offload_optimizer = _lower(_get(config, f"{zero}.offload_optimizer.device"))
    if _get(config, f"{zero}.cpu_offload") is True:  # the pre-0.4 spelling of the same
        offload_optimizer = offload_optimizer or "cpu"
    on_cpu = offload_optimizer in _OFFLOAD_DEVICES
    kind = _lower(_get(config, "optimizer.type"))
    params = _get(config, "optimizer.params")
    torch_adam = isinstance(params, Mapping) and params.get("torch_adam") is True
    op = None
    if kind in _ADAM and not torch_adam:
        op = "cpu_adam" if on_cpu else "fused_adam"
    elif kind == "adagrad" and on_cpu:
        op = "cpu_adagrad"
    elif kind == "lion":
        op = "cpu_lion" if on_cpu else "fused_lion"
    elif kind == "lamb":
        op = "fused_lamb"
    if op:
        needs.append(Need("optimizer.type", _get(config, "optimizer.type"), op))
    for part in ("offload_optimizer", "offload_param"):  # ZeRO-Infinity: swap to NVMe via aio
        field = f"{zero}.{part}.device"
        if _lower(_get(config, field)) == "nvme":
            needs.append(Need(field, _get(config, field), "async_io"))
    return tuple(needs)


def missing_ops(
    config: Mapping, installed: Mapping[str, frozenset[str]], accelerator: str
) -> tuple[Need, ...]:
    """The ops this config selects that DeepSpeed would have to build at start on this
    accelerator ("cuda" or "cpu"); `installed` maps each accelerator to its built ops."""
    have = installed.get(accelerator, frozenset())
    return tuple(need for need in ops_needed(config) if need.op not in have)


def problem_line(
    source: str, need: Need, installed: Mapping[str, frozenset[str]], accelerator: str
) -> ConfigError:
    """The one line for a missing op: the config file and field, the op, and the fix."""
    have = ", ".join(sorted(installed.get(accelerator, ()))) or "none"
    fix = _FIXES.get(need.op, "choose an optimizer and offload this image has ops for")
    return ConfigError(
        f"{source}: {need.field}",
        need.value,
        f"needs DeepSpeed's {need.op} op for the {accelerator} accelerator, which this image "
        f"does not have prebuilt (it has: {have}) and cannot build at start (no compiler)",
        f"{fix[0].upper()}{fix[1:]}, {_BUILD_FIX}",
    )


# -- which configs a job uses (pure, given a reader) --------------------------------------

# DeepSpeed's own argparse flag, the Hugging Face Trainer's, accelerate launch's.
_CONFIG_FLAGS = (
    "--deepspeed",
    "--deepspeed_config",
    "--deepspeed-config",
    "--deepspeed_config_file",
)
_ACCELERATE_FLAGS = ("--config_file", "--config-file")


def _flag_values(args: tuple[str, ...], flags: tuple[str, ...]) -> list[str]:
    out = []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in flags:
            if eq:
                out.append(value)
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                out.append(args[i + 1])
    return out


def _json(text: str | None) -> Mapping | None:
    try:
        config = json.loads(text) if text is not None else None
    except ValueError:
        return None  # not JSON: DeepSpeed's own error is the right one
    return config if isinstance(config, Mapping) else None


def configs_of(
    command: tuple[str, ...],
    generated: Mapping[str, str],
    uses_generated: bool,
    read: Callable[[str], str | None],
) -> list[tuple[str, Mapping]]:
    """(where, config) for every DeepSpeed config the command names (`--deepspeed FILE`,
    `--deepspeed_config FILE`, an accelerate config's deepspeed_config_file) and, when the job
    reads it, the plan's generated deepspeed.json (`generated`: path -> text). `read(path)`
    gives None for a file that cannot be read: the trainer reports that itself."""

    def load(path: str) -> str | None:
        return generated[path] if path in generated else read(path)

    named: list[tuple[str, str | None]] = []
    if uses_generated:
        named += [
            (path, text) for path, text in generated.items() if path.endswith("deepspeed.json")
        ]
    for value in _flag_values(command, _CONFIG_FLAGS):
        if value.lstrip().startswith("{"):  # the Trainer takes the config inline, too
            named.append(("--deepspeed (inline)", value))
        else:
            named.append((value, load(value)))
    found = [(where, config) for where, text in named if (config := _json(text)) is not None]
    for path in _flag_values(command, _ACCELERATE_FLAGS):
        found += _accelerate_configs(path, load(path), load)
    return found


def _accelerate_configs(
    path: str, text: str | None, load: Callable[[str], str | None]
) -> list[tuple[str, Mapping]]:
    try:
        body = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return []
    section = body.get("deepspeed_config") if isinstance(body, Mapping) else None
    if not isinstance(section, Mapping):
        return []
    file = section.get("deepspeed_config_file")
    if isinstance(file, str) and file:
        config = _json(load(file))
        return [(file, config)] if config is not None else []
    # accelerate's inline form: offload_optimizer_device, offload_param_device
    inline = {
        "zero_optimization": {
            part: {"device": section[f"{part}_device"]}
            for part in ("offload_optimizer", "offload_param")
            if section.get(f"{part}_device")
        }
    }
    return [(f"{path}: deepspeed_config", inline)]


# -- the edge ----------------------------------------------------------------------------


def installed_ops(env: Mapping[str, str]) -> dict[str, frozenset[str]] | None:
    """accelerator -> the ops DeepSpeed loads there without building; None: no DeepSpeed.
    Reads DeepSpeed's files without importing it (which would import torch)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    record = _literals(package / "git_version_info_installed.py")
    ops: dict[str, set[str]] = {"cuda": set(), "cpu": set()}
    built = record.get("installed_ops")
    wheel = record.get("accelerator_name")
    if isinstance(built, dict) and wheel in ops:
        ops[str(wheel)] |= {str(op) for op, on in built.items() if on}
        if wheel != "cpu":  # the CPU accelerator loads these from the wheel (prebuilt_ops.share)
            ops["cpu"] |= ops[str(wheel)] & SHARED_CPU_OPS
    extensions = env.get("TORCH_EXTENSIONS_DIR")
    if extensions and shutil.which("ninja", path=env.get("PATH")):
        ops["cpu"] |= {
            so.parent.name for so in Path(extensions).glob("*/*.so") if so.stem == so.parent.name
        }
    return {accelerator: frozenset(names) for accelerator, names in ops.items()}


def _literals(path: Path) -> dict[str, object]:
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    out = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def accelerator_of(device: str, env: Mapping[str, str]) -> str:
    """The accelerator DeepSpeed will pick: DS_ACCELERATOR, else the plan's device."""
    return env.get("DS_ACCELERATOR") or ("cuda" if device == "cuda" else "cpu")


def check(plan: Plan, env: Mapping[str, str]) -> None:
    """Refuse, before launch, a DeepSpeed config that needs an op the image lacks.
    `env` is the trainer's environment (preflight.child_env)."""
    uses_generated = plan.trainer in BUILTIN_JOBS.values() or plan.launcher == "accelerate"
    found = configs_of(tuple(plan.trainer), plan.files, uses_generated, _read)
    if not found:
        return
    accelerator = accelerator_of(plan.device, env)
    if accelerator not in ("cuda", "cpu"):
        return  # another accelerator's ops are its image's business
    installed = installed_ops(env)
    if installed is None:
        return  # no DeepSpeed: the trainer cannot be a DeepSpeed one
    for where, config in found:
        for need in missing_ops(config, installed, accelerator):
            raise problem_line(where, need, installed, accelerator)
