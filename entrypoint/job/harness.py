"""What the DeepSpeed and JAX jobs share: settings, the worker's place, rank-0 output, results.

Settings come from the command line, else ENTRYPOINT_JOB_* variables, else defaults, so that
`docker run -e ENTRYPOINT_JOB_STEPS=200 IMAGE` works without a command. No torch or jax here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from entrypoint.plan import configs

ENV = "ENTRYPOINT_JOB_"
DEFAULT_OUTPUT = "/tmp/entrypoint-job"
RESULTS_FORMAT = 1

_SETTINGS = (  # (name, type, default, help)
    (
        "steps",
        int,
        100,
        "optimizer steps to train in total, counting steps a resumed checkpoint already did",
    ),
    (
        "output",
        str,
        DEFAULT_OUTPUT,
        (
            "directory for checkpoints/ and results/; shared storage lets "
            "every node resume (mount a volume, e.g. /workspace/run)"
        ),
    ),
    ("save_every", int, 25, "save a checkpoint every this many steps (and always at the end)"),
    ("log_every", int, 10, "print the loss every this many steps (global rank 0 only)"),
    ("seed", int, 0, "seed of the synthetic data and the model's initial weights"),
    (
        "resume",
        str,
        "auto",
        (
            "auto: resume from the last checkpoint when every worker can read it; "
            "never: start fresh (the old checkpoints are moved aside)"
        ),
    ),
    (
        "fail_at_step",
        int,
        0,
        (
            "fault injection for tests of restarts and failure reports: raise at "
            "this step on --fail-rank, on the first start only (0: never)"
        ),
    ),
    ("fail_rank", int, 0, "the global rank that --fail-at-step fails"),
)


@dataclass(frozen=True)
class JobArgs:
    steps: int
    output: Path
    save_every: int
    log_every: int
    seed: int
    resume: str
    fail_at_step: int = 0
    fail_rank: int = 0

    @property
    def checkpoints(self) -> Path:
        return self.output / "checkpoints"

    @property
    def results(self) -> Path:
        return self.output / "results"


def parse_args(argv: list[str] | None, prog: str, description: str) -> JobArgs:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=f"Every option can also be set as {ENV}<NAME> (e.g. {ENV}STEPS=200); the "
        "command line wins. Results: <output>/results/rank<R>.json, one per worker.",
    )
    for name, kind, default, help_text in _SETTINGS:
        env_value = os.environ.get(ENV + name.upper(), "").strip()
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            default=kind(env_value) if env_value else default,
            help=f"{help_text} ({ENV}{name.upper()}; default %(default)s)",
        )
    args = parser.parse_args(argv)
    if args.resume not in ("auto", "never"):
        parser.error(f"--resume {args.resume}: must be auto or never")
    for name in ("steps", "save_every", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    return JobArgs(
        steps=args.steps,
        output=Path(args.output),
        save_every=args.save_every,
        log_every=args.log_every,
        seed=args.seed,
        resume=args.resume,
        fail_at_step=args.fail_at_step,
        fail_rank=args.fail_rank,
    )


def maybe_fail(args: JobArgs, rank: int, step: int) -> None:
    """--fail-at-step: a real exception on one rank, once (a restarted job gets past it)."""
    first_start = os.environ.get("ENTRYPOINT_RESTART_COUNT", "0") == "0"
    if args.fail_at_step == step and args.fail_rank == rank and first_start:
        raise RuntimeError(f"injected failure at step {step} on rank {rank} (--fail-at-step)")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


class StopRequest:
    """A stop signal (preemption: SIGTERM; SLURM's --signal: SIGUSR1/2) noted by a handler.
    The job asks every worker each step (one tiny collective) so that a signal reaching any
    worker makes all of them checkpoint together, then exit with 128 + the signal."""

    def __init__(self) -> None:
        self.signal = 0
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._note)

    def _note(self, number: int, _frame: FrameType | None) -> None:
        self.signal = self.signal or int(number)

    @staticmethod
    def name(number: int) -> str:
        return signal.Signals(number).name


@dataclass(frozen=True)
class Place:
    """Where this worker stands, as its launcher told it (torchrun's or the entrypoint's
    variables)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    node: str

    @classmethod
    def from_env(cls, rank_var: str = "RANK", world_var: str = "WORLD_SIZE") -> Place:
        env = os.environ
        rank = int(env.get(rank_var, "0"))
        local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
        node_rank = (
            env.get("GROUP_RANK") or env.get("NODE_RANK") or str(rank // max(local_world, 1))
        )
        return cls(
            rank=rank,
            world_size=int(env.get(world_var, "1")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=local_world,
            node_rank=int(node_rank),
            node=socket.gethostname(),
        )


def read_plan() -> dict:
    """The entrypoint's plan for this node ({} when the job was started by hand)."""
    path = os.environ.get("ENTRYPOINT_PLAN_FILE")
    if not path:
        return {}
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def deepspeed_config(world_size: int, device: str) -> tuple[dict, str]:
    """(DeepSpeed config, where it came from): the entrypoint's derived file, else the shipped
    config for this device with the accumulation derived here (a job started by hand)."""
    path = os.environ.get("ENTRYPOINT_DEEPSPEED_CONFIG")
    if path:
        return json.loads(Path(path).read_text()), path
    name = "cpu" if device == "cpu" else "1gpu"
    config = configs.shipped()[name]
    return configs.derive_deepspeed(
        config, world_size
    ), f"shipped {name} (no ENTRYPOINT_DEEPSPEED_CONFIG)"


class Console:
    """Progress bar and log lines on global rank 0 only; warnings from any rank.

    On a terminal the bar is live (tqdm). Elsewhere (docker logs, a platform's log viewer) a
    live bar would be one endless line of carriage returns, so each log line carries the bar
    instead."""

    def __init__(self, rank: int, prefix: str = "job") -> None:
        self.rank, self.prefix = rank, prefix
        self.bar: Any = None
        self.total: int | None = None
        self.done = self.initial = 0
        self.since = time.monotonic()

    def log(self, message: str, meter: bool = False) -> None:
        if self.rank != 0:
            return
        line = f"[{self.prefix}] {message}"
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
            return
        if meter and self.total is not None:
            line += "  " + self._meter()
        print(line, flush=True)

    def warn(self, message: str) -> None:
        print(f"[{self.prefix} rank {self.rank}] WARNING: {message}", file=sys.stderr, flush=True)

    def progress(self, total: int, initial: int) -> None:
        if self.rank != 0:
            return
        self.total, self.done, self.initial, self.since = total, initial, initial, time.monotonic()
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(
                total=total,
                initial=initial,
                desc="train",
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
            )

    def _meter(self) -> str:
        elapsed = time.monotonic() - self.since
        try:
            from tqdm import tqdm
        except ImportError:
            return f"{self.done}/{self.total}"
        return tqdm.format_meter(
            self.done,
            self.total,
            elapsed,
            ncols=72,
            prefix="train",
            unit="step",
            initial=self.initial,
        )

    def advance(self, loss: float | None = None) -> None:
        self.done += 1
        if self.bar is not None:
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar = self.total = None


@dataclass
class Results:
    """One worker's report, written to <output>/results/rank<R>.json at the end."""

    job: str  # "deepspeed" or "jax"
    rank: int
    world_size: int  # workers (DeepSpeed) or processes (JAX)
    local_rank: int
    node_rank: int
    node: str  # hostname
    backend: str  # "gloo", "nccl", "jax-cpu", "jax-gpu"
    device: str  # "cpu" or "cuda"
    devices: int  # devices in the whole job (world size on DeepSpeed; jax.device_count() on JAX)
    steps: int  # optimizer steps done in total, checkpoint included
    trained_steps: int  # steps this run trained
    resumed_from: int | None  # the checkpoint's step, or null for a fresh start
    first_loss: float | None  # mean over all workers at the first step of this run
    final_loss: float | None  # mean over all workers at the last step
    loss_floor: float  # the synthetic task's entropy: the best loss reachable
    global_batch: int
    checkpoint_writer: bool  # this worker wrote the model weights and the `latest` marker
    checkpoint: str | None  # the last checkpoint saved (or resumed from)
    seconds: float  # wall time from the job's start to its end
    stopped_by: str | None = None  # the signal that stopped it early (checkpoint saved), if any
    format: int = RESULTS_FORMAT

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"rank{self.rank}.json"
        tmp = path.with_suffix(f".json.tmp{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)
        return path


def move_aside(directory: Path, node_rank: int) -> Path | None:
    """Move an old checkpoint directory out of the way of a fresh start (never deleted)."""
    if not directory.exists():
        return None
    target = directory.with_name(f"{directory.name}.old-{int(time.time())}-node{node_rank}")
    try:
        directory.rename(target)
    except FileNotFoundError:  # another node sharing the storage moved it first
        return None
    return target


def drop_stale_results(directory: Path, world_size: int) -> None:
    """Remove reports of ranks this job does not have (left by an earlier, larger run)."""
    for path in directory.glob("rank*.json"):
        rank = path.stem.removeprefix("rank")
        if rank.isdigit() and int(rank) >= world_size:
            path.unlink(missing_ok=True)
