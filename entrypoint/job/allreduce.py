"""`python -m entrypoint.job.allreduce [--then CMD...]`: all-reduce bandwidth across every worker.

Started as the trainer by the usual launch path, so it joins, is compared and supervised like
any job: `entrypoint doctor --allreduce` on every node, or, with
ENTRYPOINT_PREFLIGHT_ALLREDUCE=true, before the trainer (the plan makes the trainer
`python -m entrypoint.job.allreduce --then <trainer...>`). gloo on CPU, NCCL on GPUs.

Every worker all-reduces (sum) float32 tensors of a few sizes: one checked call, warm-up calls,
then timed calls. The figures are nccl-tests' (its doc/PERFORMANCE.md): time = the mean time
of one all-reduce, averaged over the ranks; algbw = size / time; busbw = algbw x 2(n-1)/n, the
figure to compare with the links' speed whatever the rank count. Global rank 0 prints the table
and writes allreduce.json next to the plan file.

With --then the measurement's process group lives under a prefix of its own in torchrun's agent
store and is destroyed; then the worker execs the trainer in the same process (same pid, RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT), whose init_process_group finds no stale keys.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from entrypoint.job.harness import read_plan

if TYPE_CHECKING:
    import torch

DEFAULT_SIZES_MIB = (1, 16, 64)
STORE_PREFIX = "entrypoint/allreduce"
EXIT_WRONG = 1  # results differ from the expected sum: the fabric or a library is broken


def bandwidth(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s), as nccl-tests defines them for all-reduce."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * 2 * (world - 1) / world


def summary(
    *,
    backend: str,
    device: str,
    world: int,
    nnodes: int,
    warmup: int,
    iters: int,
    measured: list[tuple[int, float, float, int]],
) -> dict:
    """The result as JSON: measured = (bytes, mean seconds over ranks, slowest rank's, wrong)."""
    rows = []
    for nbytes, seconds, slowest, wrong in measured:
        algbw, busbw = bandwidth(nbytes, seconds, world)
        rows.append(
            {
                "bytes": nbytes,
                "count": nbytes // 4,
                "time_us": seconds * 1e6,
                "slowest_rank_time_us": slowest * 1e6,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw,
                "wrong": wrong,
            }
        )
    return {
        "backend": backend,
        "device": device,
        "dtype": "float32",
        "op": "sum",
        "world_size": world,
        "nnodes": nnodes,
        "warmup": warmup,
        "iters": iters,
        "results": rows,
    }


def _size(nbytes: int) -> str:
    mib = nbytes / (1 << 20)
    return f"{mib:.0f} MiB" if mib >= 1 else f"{nbytes / 1024:.0f} KiB"


def table(result: dict) -> str:
    head = (
        f"all-reduce: {result['world_size']} ranks on {result['nnodes']} node(s), "
        f"{result['backend']} on {result['device']}, {result['dtype']} {result['op']}, "
        f"{result['iters']} timed after {result['warmup']} warm-up"
    )
    lines = [
        head,
        (
            f"{'size':>10} {'count':>10} {'time (us)':>12} {'algbw (GB/s)':>13} "
            f"{'busbw (GB/s)':>13} {'wrong':>6}"
        ),
    ]
    for row in result["results"]:
        lines.append(
            f"{_size(row['bytes']):>10} {row['count']:>10} {row['time_us']:>12.1f} "
            f"{row['algbw_gbps']:>13.3f} {row['busbw_gbps']:>13.3f} {row['wrong']:>6}"
        )
    lines.append(
        "(as nccl-tests: algbw = size / time, busbw = algbw x 2(n-1)/n; time: mean over the ranks)"
    )
    return "\n".join(lines)


def then_command(then: list[str], python: str) -> list[str]:
    """The trainer as torchrun would have started it: `python x.py` and `x.py` with this
    Python, unbuffered (torchrun passes -u); anything else as it is."""
    if then and then[0] == "--":
        then = then[1:]
    if os.path.basename(then[0]).startswith("python"):
        return [python, "-u", *then[1:]]
    if then[0].endswith(".py"):
        return [python, "-u", *then]
    return list(then)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m entrypoint.job.allreduce",
        description="Measure all-reduce bandwidth across every worker (started by torchrun).",
    )
    parser.add_argument(
        "--sizes",
        default=",".join(str(s) for s in DEFAULT_SIZES_MIB),
        help="tensor sizes in MiB, comma-separated (default %(default)s)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per size")
    parser.add_argument("--iters", type=int, default=5, help="timed calls per size")
    parser.add_argument(
        "--format",
        choices=("table", "json", "none"),
        default="table",
        help="what global rank 0 prints on stdout (it always writes the JSON file)",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="JSON file written by global rank 0 (default: allreduce.json next "
        "to ENTRYPOINT_PLAN_FILE)",
    )
    parser.add_argument(
        "--then",
        nargs=argparse.REMAINDER,
        default=None,
        help="CMD ARGS...: exec this trainer in the same worker process afterwards",
    )
    args = parser.parse_args(argv)
    try:
        args.sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes {args.sizes}: give MiB as numbers, e.g. 1,16,64")
    if not args.sizes or min(args.sizes) <= 0 or args.warmup < 0 or args.iters < 1:
        parser.error("--sizes must be positive, --warmup at least 0, --iters at least 1")
    if args.then is not None and not [a for a in args.then if a != "--"]:
        parser.error("--then needs the trainer command")
    return args


def _output_path(given: str | None) -> Path:
    if given:
        return Path(given)
    plan_file = os.environ.get("ENTRYPOINT_PLAN_FILE")
    return Path(plan_file).parent / "allreduce.json" if plan_file else Path("allreduce.json")


def measure(sizes_mib: list[float], warmup: int, iters: int) -> dict:
    """The edge: a process group of its own, the timed calls, the figures of every rank."""
    import torch
    import torch.distributed as dist

    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", "0"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    planned = read_plan().get("device")
    cuda = torch.cuda.is_available() and planned != "cpu"
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    _init_group(backend, rank, world)
    mine = [_time_size(mib, rank, world, device, warmup, iters) for mib in sizes_mib]
    measured = _every_rank(mine, world, device)
    dist.destroy_process_group()
    if cuda:
        torch.cuda.empty_cache()
    return summary(
        backend=backend,
        device=device.type,
        world=world,
        nnodes=max(1, world // max(1, local_world)),
        warmup=warmup,
        iters=iters,
        measured=measured,
    )


def _init_group(backend: str, rank: int, world: int) -> None:
    """The measurement's own process group, on a store under its own prefix per restart."""
    import torch.distributed as dist

    env = os.environ
    timeout = timedelta(seconds=int(env.get("ENTRYPOINT_COLLECTIVE_TIMEOUT", "600")))
    # torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE); else rank 0 does, as in
    # torch's own env:// rendezvous.
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        world_size=world,
        is_master=not agent and rank == 0,
        timeout=timeout,
        wait_for_workers=False,
    )
    attempt = env.get("ENTRYPOINT_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"{STORE_PREFIX}/{attempt}", base)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_size(
    mib: float, rank: int, world: int, device: torch.device, warmup: int, iters: int
) -> tuple[int, float, int]:
    """One size on this rank: (bytes, seconds per call, elements the checked call got wrong)."""
    import torch
    import torch.distributed as dist

    count = max(1, int(mib * (1 << 20)) // 4)
    tensor = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(tensor)
    wrong = int((tensor != world * (world + 1) / 2).sum().item())
    tensor.zero_()  # the timed calls sum zeros: no overflow, same work
    for _ in range(warmup):
        dist.all_reduce(tensor)
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    _sync(device)
    return count * 4, (time.perf_counter() - start) / iters, wrong


def _every_rank(
    mine: list[tuple[int, float, int]], world: int, device: torch.device
) -> list[tuple[int, float, float, int]]:
    """Each size over every rank: (bytes, mean seconds per call, the slowest rank's, wrong)."""
    import torch
    import torch.distributed as dist

    times = torch.tensor([m[1] for m in mine], dtype=torch.float64, device=device)
    slowest = times.clone()
    wrongs = torch.tensor([float(m[2]) for m in mine], dtype=torch.float64, device=device)
    dist.all_reduce(times)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    dist.all_reduce(wrongs)
    _sync(device)
    return [
        (nbytes, t / world, s, int(w))
        for (nbytes, _, _), t, s, w in zip(
            mine, times.tolist(), slowest.tolist(), wrongs.tolist(), strict=True
        )
    ]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.then is not None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        print(
            "entrypoint: error: ENTRYPOINT_PREFLIGHT_ALLREDUCE='true': these workers were not "
            "started by torchrun, whose agent's store outlives the measurement. Unset it, and "
            "measure alone with `entrypoint doctor --allreduce`",
            file=sys.stderr,
        )
        return 2
    result = measure(args.sizes, args.warmup, args.iters)
    rank = int(os.environ["RANK"])
    wrong = sum(row["wrong"] for row in result["results"])
    if rank == 0:
        path = _output_path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(path)
        if args.format == "table":
            print(table(result), flush=True)
        elif args.format == "json":
            print(json.dumps(result), flush=True)
    if wrong:
        print(
            f"entrypoint: error: all-reduce: {wrong} wrong values across the ranks (expected "
            "every element to be the sum of the ranks' values). Check the network, NCCL and "
            "driver versions on every node (entrypoint doctor)",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_WRONG
    if args.then is not None:
        command = then_command(args.then, sys.executable)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvp(command[0], command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
