"""This node's GPUs as the plan sees them: which ids it may use, how many, and the device.

Pure: the environment and the probed facts in, decided values out. `run` calls
`visible_ids` again only to compare the plan's promise with what the probe found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.facts import Facts
from entrypoint.plan.platforms.base import Reading
from entrypoint.plan.settings import PREFIX, Settings
from entrypoint.plan.values import (
    Kind,
    Source,
    Sourced,
    by_default,
    derived,
    device_list,
    env_var,
    probed,
)

DEVICE = f"{PREFIX}DEVICE"


def visible_ids(env: Mapping[str, str], facts: Facts) -> tuple[list[str] | None, Source]:
    """The GPU ids this node may use (as CUDA_VISIBLE_DEVICES spells them), when known."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = list(device_list("CUDA_VISIBLE_DEVICES", cvd))  # '' or -1: no GPU, as CUDA reads it
        if not ids:
            return [], env_var("CUDA_VISIBLE_DEVICES", "(hides every GPU)")
        # Probed: every listed GPU must exist here (no GPUs 0-15 listed on an 8-GPU node).
        if facts.gpus is not None:
            uuids = [g.uuid for g in facts.gpus if g.uuid]
            missing = [
                x
                for x in ids
                if not (
                    (x.isdigit() and int(x) < len(facts.gpus))
                    or (x.startswith(("GPU-", "MIG-")) and any(u.startswith(x) for u in uuids))
                )
            ]
            if missing:
                n = len(facts.gpus)
                raise ConfigError(
                    "CUDA_VISIBLE_DEVICES",
                    cvd,
                    f"names GPU {','.join(missing)} but this node has {n} ({facts.gpu_probe})",
                    f"List only this node's GPUs ({'0' if n == 1 else f'0-{n - 1}'}) or unset it: "
                    "a 2 x 8 job is not 1 x 16"
                    if n
                    else "Unset it, or start the container "
                    "with its GPUs (--gpus all, the NVIDIA runtime)",
                )
        return ids, env_var("CUDA_VISIBLE_DEVICES")
    if facts.gpus is None:
        return None, probed("not probed")
    ids = [str(gpu.index) for gpu in facts.gpus]
    nvd = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if nvd in ("void", "none"):
        return [], env_var("NVIDIA_VISIBLE_DEVICES", f"={nvd}")
    if nvd and nvd != "all":
        wanted = [x.strip() for x in nvd.split(",")]
        by_uuid = [str(g.index) for g in facts.gpus if g.uuid and g.uuid in wanted]
        if by_uuid:
            return by_uuid, probed(
                f"{facts.gpu_probe}, restricted by NVIDIA_VISIBLE_DEVICES (UUIDs)"
            )
        # Indices: the container runtime has already hidden the others from NVML.
    return ids, probed(facts.gpu_probe)


@dataclass(frozen=True)
class GpuCount:
    """What `count` decided: this node's GPUs and the ids its workers may use."""

    per_node: Sourced[int]  # GPUs per node
    visible: Sourced[tuple[str, ...]]  # as CUDA_VISIBLE_DEVICES spells them, `per_node` of them


def count(env: Mapping[str, str], settings: Settings, reading: Reading, facts: Facts) -> GpuCount:
    """ENTRYPOINT_GPUS_PER_NODE, else the platform's count, else the GPUs visible, else 0.

    Args:
        env: the node's environment (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES).
        settings: the ENTRYPOINT_* settings (`gpus_per_node`).
        reading: the platform's reading (its `gpus_per_node`).
        facts: this node's probed GPUs (None: not probed).

    Returns:
        The GPUs per node and the ids this node may use, each with its source.

    Raises:
        ConfigError: CUDA_VISIBLE_DEVICES is malformed, names a GPU this node lacks, or
            leaves fewer GPUs visible than stated.
    """
    visible, visible_from = visible_ids(env, facts)
    if settings.gpus_per_node is not None:
        stated = Sourced(settings.gpus_per_node, env_var(f"{PREFIX}GPUS_PER_NODE"))
    elif reading.gpus_per_node is not None:
        stated = reading.gpus_per_node
    elif visible is not None:
        stated = Sourced(len(visible), visible_from)
    else:
        stated = Sourced(0, by_default("default 0 (no GPU stated or probed)"))
    if visible is None:
        visible = [str(i) for i in range(stated.value)]
        if stated.value:
            visible_from = derived(f"0..{stated.value - 1} from the stated count")
    elif len(visible) > stated.value:
        visible = visible[: stated.value]
    elif len(visible) < stated.value and visible_from.kind is Kind.ENV:
        raise ConfigError(
            stated.source.names(f"{PREFIX}GPUS_PER_NODE"),
            stated.value,
            f"but {visible_from} leaves {len(visible)} GPUs visible",
            "State the number of GPUs this node really has, or widen CUDA_VISIBLE_DEVICES",
        )
    return GpuCount(stated, Sourced(tuple(visible), visible_from))


def device(settings: Settings, gpus: int) -> Sourced[str]:
    """cuda or cpu: ENTRYPOINT_DEVICE, else whether the node has GPUs.

    Args:
        settings: the ENTRYPOINT_* settings (`device`).
        gpus: the GPUs per node, as `count` decided.

    Returns:
        The device and its source.

    Raises:
        ConfigError: ENTRYPOINT_DEVICE=cuda on a node with no GPU stated or visible.
    """
    if settings.device == "cuda" and gpus == 0:
        raise ConfigError(
            DEVICE,
            "cuda",
            "asks for GPUs but none is stated or visible",
            "Start the container with --gpus all (or the NVIDIA runtime), or set "
            f"{PREFIX}GPUS_PER_NODE",
        )
    if settings.device != "auto":
        return Sourced(settings.device, env_var(DEVICE))
    why = derived("auto: GPUs present" if gpus else "auto: no GPU, workers run on CPU with gloo")
    return Sourced("cuda" if gpus else "cpu", why)
