"""What torch's Flight Recorder costs a gloo collective, and what answering the entrypoint costs.

The plan sets TORCH_FR_BUFFER_SIZE=2000 on every node (torch 2.10 records nothing without it;
torch 2.14 records by default), so that a hang names the collective a rank never entered. Two
real gloo ranks on loopback run N all-reduces of one float (the smallest collective: the
recorder's share is the largest) with the buffer at 2000 and at 0, in alternating rounds; then
the time a rank takes to sum up a full recorder (`entrypoint.trainer_side.flight`: torch's JSON
dump of 2,000 entries, read and summed up, written to a file). Prints figures; asserts nothing.

    python benchmarks/flight_recorder.py [--collectives 3000] [--rounds 3]

Run it where the torch to measure is: `docker run --rm -v $PWD:/w -w /w --entrypoint python
multinode:dev benchmarks/flight_recorder.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from loopback import free_ports

RANK = textwrap.dedent(
    """
    import os, sys, time, json, torch, torch.distributed as dist
    rank, n = int(os.environ["RANK"]), int(sys.argv[2])
    dist.init_process_group("gloo", init_method=sys.argv[1], rank=rank, world_size=2)
    t = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    took = time.perf_counter() - start
    answer = None
    if rank == 0 and sys.argv[3] != "0":
        sys.path.insert(0, sys.argv[4])
        from entrypoint.trainer_side import flight
        out = os.path.join(sys.argv[5], "x")
        begin = time.perf_counter()
        flight.write(out)
        answer = [time.perf_counter() - begin, len(flight._entries()), open(out).read()]
    print(json.dumps([took / n, answer]), flush=True)
    dist.destroy_process_group()
    """
)


def one_round(script: Path, n: int, buffer: str, tmp: str) -> tuple[float, list | None]:
    init = f"tcp://127.0.0.1:{free_ports()}"
    repo = str(Path(__file__).resolve().parents[1])
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), init, str(n), buffer, repo, tmp],
            env=os.environ | {"RANK": str(rank), "TORCH_FR_BUFFER_SIZE": buffer},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    return max(o[0] for o in outs), outs[0][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collectives", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(RANK)
        per: dict[str, list[float]] = {"2000": [], "0": []}
        answer = None
        for _ in range(args.rounds):
            for buffer in ("2000", "0"):
                took, got = one_round(script, args.collectives, buffer, tmp)
                per[buffer].append(took)
                answer = got or answer
    on, off = statistics.median(per["2000"]), statistics.median(per["0"])
    print(f"torch {torch.__version__}, 2 gloo ranks on loopback, all_reduce of 1 float:")
    print(f"  TORCH_FR_BUFFER_SIZE=2000: {on * 1e6:.1f} µs a collective (median of {args.rounds})")
    print(f"  TORCH_FR_BUFFER_SIZE=0:    {off * 1e6:.1f} µs a collective")
    print(f"  the recorder's share:      {(on - off) * 1e6:+.1f} µs ({(on - off) / off:+.1%})")
    if answer:
        seconds, entries, text = answer
        print(
            f"  answering the entrypoint: {seconds * 1e3:.1f} ms for {entries} entries "
            f"(the summary written: {text})"
        )


if __name__ == "__main__":
    main()
