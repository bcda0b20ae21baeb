"""A user's DDP trainer on a GPU that every "node" of benchmarks/gpu_machine.sh shares: torch's
DDP over gloo (NCCL refuses two ranks on one GPU: "Duplicate GPU detected"), an MLP trained on
cuda, a checkpoint every GPU_SAVE_EVERY steps that a restart resumes from, whatever the new
world size. Written as a user would write it; it knows nothing of the entrypoint.

GPU_OUT         directory for ckpt.pt and rank<R>.json (shared by the nodes)
GPU_STEPS       steps to train in total (default 300); GPU_SAVE_EVERY (10); GPU_BATCH (8192)
"""

import time

begun = time.time()  # before torch's import: what a restart costs this trainer

import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

imported = time.time()
out = Path(os.environ["GPU_OUT"])
steps = int(os.environ.get("GPU_STEPS", "300"))
save_every = int(os.environ.get("GPU_SAVE_EVERY", "10"))
batch = int(os.environ.get("GPU_BATCH", "8192"))

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ.get("LOCAL_RANK", "0"))
device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)

torch.manual_seed(0)
width = 1024
model = torch.nn.Sequential(
    *[m for _ in range(4) for m in (torch.nn.Linear(width, width), torch.nn.GELU())],
    torch.nn.Linear(width, 1),
).to(device)
ddp = DDP(model, device_ids=[local] if device.type == "cuda" else None)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

ckpt = out / "ckpt.pt"
start = 0
if ckpt.exists():
    state = torch.load(ckpt, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
print(
    f"[gpu-trainer] rank {rank}/{world} on {device} "
    f"({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
    f"starts at step {start} ({time.time() - begun:.1f} s after its process began: torch "
    f"imported {imported - begun:.1f} s, process group formed, checkpoint loaded)",
    flush=True,
)

loss = torch.zeros(())
for step in range(start + 1, steps + 1):
    g = torch.Generator(device=device).manual_seed(step * 1000 + rank)
    x = torch.randn(batch, width, device=device, generator=g)
    y = x[:, :1].sin()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if rank == 0:
        print(f"[gpu-trainer] step {step}/{steps} loss {loss.item():.5f}", flush=True)
        if step % save_every == 0 or step == steps:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state | {"step": step}, out / "ckpt.tmp")
            os.replace(out / "ckpt.tmp", ckpt)

report = {
    "rank": rank,
    "world_size": world,
    "start": start,
    "last_step": steps,
    "loss": round(float(loss.item()), 6),
    "restart": int(os.environ.get("ENTRYPOINT_RESTART_COUNT", "0")),
    "seconds": round(time.time() - begun, 2),
}
(out / f"rank{rank}.json").write_text(json.dumps(report))
dist.destroy_process_group()
