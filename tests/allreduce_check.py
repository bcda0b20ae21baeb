"""A worker that all-reduces over the process group and reports what it saw (used by tests)."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

# A slow rank 0 (tests of the all-reduce preflight: the others must not read stale store keys).
if os.environ.get("RANK") == "0":
    time.sleep(float(os.environ.get("ALLREDUCE_RANK0_DELAY", "0")))

backend = "nccl" if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES") else "gloo"
if backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
device = (
    torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
)
value = torch.tensor([float(rank + 1)], device=device)
dist.all_reduce(value)
report = {
    "rank": rank,
    "world_size": world,
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "sum": value.item(),
    "expected": world * (world + 1) / 2,
    "backend": backend,
    "env_world_size": int(os.environ["WORLD_SIZE"]),
    "argv": sys.argv[1:],  # DeepSpeed's launcher's scripts get --local_rank=N here
    "path0": sys.path[0],  # the script's directory, as `python script.py` has it
}
print("ALLREDUCE " + json.dumps(report), flush=True)
out = os.environ.get("ALLREDUCE_OUT")
if out:
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
dist.destroy_process_group()
sys.exit(0 if report["sum"] == report["expected"] else 1)
