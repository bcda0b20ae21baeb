"""NCCL and gloo settings for this node: which interface, InfiniBand, error handling.

Pure: the facts come from entrypoint.supervise.probe. Anything NCCL_*/GLOO_* the user set wins.
"""

from __future__ import annotations

from collections.abc import Mapping

from entrypoint.plan.facts import Facts, is_local_only
from entrypoint.plan.settings import PREFIX, Settings
from entrypoint.plan.values import Kind, Source, by_default, env_var, probed

IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def choose_interface(facts: Facts, settings: Settings) -> tuple[str | None, Source]:
    if settings.socket_ifname:
        return settings.socket_ifname, env_var(f"{PREFIX}SOCKET_IFNAME")
    route = facts.route_to_master
    if route and not is_local_only(route):
        return route, probed(f"probe: routes to the master ({facts.master_ip})")
    default = facts.default_route
    if default and not is_local_only(default):
        why = "the master is this node" if route else "the master's name did not resolve yet"
        return default, probed(f"probe: default route ({why})")
    return None, probed("probe: no interface other than loopback or a container bridge")


FAMILY = "NCCL_SOCKET_FAMILY"


def socket_family(env: Mapping[str, str], facts: Facts) -> tuple[str | None, Source] | None:
    """NCCL's address family: AF_INET6 when the master is reached over IPv6 (NCCL would
    otherwise take the interface's IPv4 address first), the user's own value kept; None (not
    set) for an IPv4 master. (value to set or None to keep, its source)."""
    if FAMILY in env:
        return None, env_var(FAMILY, "(set by you, kept)")
    if facts.master_ip and ":" in facts.master_ip:
        when = (
            f", its name resolved {facts.master_resolved_after:.1f} s after the start"
            if facts.master_resolved_after is not None
            else ""
        )
        return "AF_INET6", probed(f"probe: the master's address is IPv6 ({facts.master_ip}){when}")
    return None


def settle(
    env: Mapping[str, str], facts: Facts, settings: Settings, *, nnodes: int, device: str
) -> tuple[dict[str, str], dict[str, Source], list[str]]:
    out: dict[str, str] = {}
    sources: dict[str, Source] = {}
    warnings: list[str] = []

    if nnodes > 1:
        iface, why = choose_interface(facts, settings)
        for name in IFNAME_VARS:
            if name in env:
                sources[name] = env_var(name, "(set by you, kept)")
            elif iface:
                out[name], sources[name] = iface, why
        if iface is None and not all(name in env for name in IFNAME_VARS):
            warnings.append(
                f"no network interface found for traffic between nodes ({why}); "
                f"set {PREFIX}SOCKET_IFNAME to the interface that reaches the other nodes"
            )
        family = socket_family(env, facts)
        if family is not None:
            sources[FAMILY] = family[1]
            if family[0] is not None:
                out[FAMILY] = family[0]

    if facts.ib_hcas and device == "cuda":
        if "NCCL_IB_HCA" in env:
            sources["NCCL_IB_HCA"] = env_var("NCCL_IB_HCA", "(set by you, kept)")
        else:
            out["NCCL_IB_HCA"] = ",".join(facts.ib_hcas)
            sources["NCCL_IB_HCA"] = probed("probe /sys/class/infiniband")

    # Surface NCCL failures as errors instead of hangs (torch's TORCH_NCCL_ASYNC_ERROR_HANDLING=1:
    # abort the communicator and tear down the process).
    legacy = "NCCL_ASYNC_ERROR_HANDLING"
    if "TORCH_NCCL_ASYNC_ERROR_HANDLING" in env or legacy in env:
        sources["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = Source(Kind.ENV, None, "(set by you, kept)")
    else:
        out["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        sources["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = by_default(
            "default 1: fail on NCCL errors, never hang"
        )
    recorder, recorder_sources = flight_recorder(env, str(settings.run_dir), device)
    return out | recorder, sources | recorder_sources, warnings


# torch's Flight Recorder: each rank's last collectives (gloo's too), read by the entrypoint
# when the ranks stop stepping (entrypoint.trainer_side.flight), so that a hang names the
# collective a rank never entered; on GPU nodes NCCL also dumps them when one times out (torch's
# own analyzer reads those dumps). The buffer's size: TORCH_FR_BUFFER_SIZE, which the images'
# torch (2.10, 2.14) reads (2.10 records nothing without it); torch 2.13 and later warn on every
# rank that the older TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated, and take it when it is set:
# either name set by you is kept.
FLIGHT_RECORDER = {"TORCH_FR_BUFFER_SIZE": "2000"}
FLIGHT_RECORDER_GPU = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
FLIGHT_RECORDER_OLD_NAMES = {  # torch reads the old names still; yours under one is kept
    "TORCH_FR_BUFFER_SIZE": ("TORCH_NCCL_TRACE_BUFFER_SIZE",),
    "TORCH_FR_DUMP_TEMP_FILE": ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE",),
}


def flight_recorder(
    env: Mapping[str, str], run_dir: str, device: str
) -> tuple[dict[str, str], dict[str, Source]]:
    """The Flight Recorder's variables to set, and the source of each (yours kept)."""
    out: dict[str, str] = {}
    sources: dict[str, Source] = {}
    values = dict(FLIGHT_RECORDER)
    why = "torch's Flight Recorder: each rank's last collectives, read when the ranks stop stepping"
    if device == "cuda":
        values |= FLIGHT_RECORDER_GPU
        values["TORCH_FR_DUMP_TEMP_FILE"] = f"{run_dir}/flight-recorder/rank_"
        why += "; on GPU nodes NCCL's, dumped into the run directory when one times out"
    for name, value in values.items():
        names = (name, *FLIGHT_RECORDER_OLD_NAMES.get(name, ()))
        given = next((each for each in names if each in env), None)
        if given is not None:
            sources[given] = env_var(given, "(set by you, kept)")
        else:
            out[name] = value
            sources[name] = by_default(why)
    return out, sources
