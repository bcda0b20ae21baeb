"""ENTRYPOINT_* variables that are not settings: a misspelt one is warned about (or, with
ENTRYPOINT_STRICT=1, refused by entrypoint.plan.settings), never silently ignored. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from entrypoint.plan.values import PREFIX

# ENTRYPOINT_* variables that are not settings, yet the entrypoint's own: the built-in job's
# options (entrypoint/job/harness.py), and what the entrypoint sets for the trainer.
OTHER_VARIABLES = frozenset(
    {
        *(
            f"ENTRYPOINT_JOB_{name}"
            for name in (
                "STEPS",
                "OUTPUT",
                "SAVE_EVERY",
                "LOG_EVERY",
                "SEED",
                "RESUME",
                "FAIL_AT_STEP",
                "FAIL_RANK",
                "VERBOSE",
            )
        ),  # fmt: skip
        "ENTRYPOINT_RESTART_COUNT",
        "ENTRYPOINT_PLAN_FILE",
        "ENTRYPOINT_NODE_PID",
        "ENTRYPOINT_ADOPTED_PID",
        "ENTRYPOINT_CONFIG_DIR",
        "ENTRYPOINT_DEEPSPEED_CONFIG",
        "ENTRYPOINT_ACCELERATE_CONFIG",
        "ENTRYPOINT_COLLECTIVE_TIMEOUT",
        "ENTRYPOINT_PROGRESS_SOCKET",
        "ENTRYPOINT_STACKS_DIR",
        "ENTRYPOINT_IMAGE_DIR",
    }
)


def known(fields: Iterable[str]) -> frozenset[str]:
    """Every ENTRYPOINT_* name the entrypoint knows: its settings' (`fields`) and its own."""
    return OTHER_VARIABLES | {PREFIX + name.upper() for name in fields}


def unknown(env: Mapping[str, str], fields: Iterable[str]) -> list[str]:
    """The ENTRYPOINT_* variables in `env` that are neither a setting nor the entrypoint's own."""
    names = known(fields)
    return sorted(n for n in env if n.startswith(PREFIX) and n not in names)


def misspelt_fix(name: str, fields: Iterable[str]) -> str:
    """`Did you mean ENTRYPOINT_SPARES?`, or where the settings are listed."""
    import difflib  # only when a variable is misspelt

    close = difflib.get_close_matches(name, sorted(known(fields)), n=1, cutoff=0.75)
    return (
        f"Did you mean {close[0]}? (`entrypoint settings` lists them)"
        if close
        else "Unset it; `entrypoint settings` lists the settings"
    )


def warnings(env: Mapping[str, str], fields: Iterable[str]) -> list[str]:
    """One warning for each ENTRYPOINT_* variable that is not a setting."""
    fields = list(fields)
    return [
        f"{name} is not a setting, and nothing reads it. {misspelt_fix(name, fields)}"
        for name in unknown(env, fields)
    ]
