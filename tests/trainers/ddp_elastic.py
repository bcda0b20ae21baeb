"""A DDP trainer written the way torchrun's documentation asks of one that is started again
("Train script": https://docs.pytorch.org/docs/stable/elastic/train_script.html): at its start
it loads the last checkpoint if there is one, and it checkpoints as it goes, so a restart loses
only the steps since. The model and the save follow torch's DDP tutorial ("Save and Load
Checkpoints": rank 0 saves, the others wait at a barrier); the checkpoint is written whole
(a temporary file, then renamed), so a kill in the middle of a save leaves the last one. On CPU
with gloo when no GPU is present. Nothing in it knows about the entrypoint.

Run:  entrypoint run -- python ddp_elastic.py --checkpoint /shared/ddp.pt --steps 300

Rank 0 prints `ddp_elastic: step S/N loss L` every 10 steps; every rank prints
`ddp_elastic: rank R of W finished N steps, resumed from step S (weights checksum C)`.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net1 = nn.Linear(width, width)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def load_checkpoint(path: str, model: nn.Module, optimizer: optim.Optimizer) -> int:
    """The step the checkpoint at `path` ends, its weights and optimizer loaded; 0 without one."""
    if not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save_checkpoint(path: str, model: nn.Module, optimizer: optim.Optimizer, step: int) -> None:
    partial = f"{path}.partial"
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial
    )
    os.replace(partial, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkpoint", required=True, help="the checkpoint file, on a shared volume"
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--width", type=int, default=512, help="the toy model's hidden width")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = int(os.environ["LOCAL_RANK"]) if use_cuda else "cpu"
    if use_cuda:
        torch.cuda.set_device(device)
    model = ToyModel(args.width).to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.001)
    start = load_checkpoint(args.checkpoint, model, optimizer)  # before DDP: one copy on each rank
    ddp_model = DDP(model, device_ids=[device] if use_cuda else None)
    if start and rank == 0:
        print(f"ddp_elastic: resumed from step {start} ({args.checkpoint})", flush=True)

    loss_fn = nn.MSELoss()
    for step in range(start, args.steps):
        torch.manual_seed(world * step + rank)  # every rank its own data, the same after a restart
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(64, args.width).to(device))
        loss = loss_fn(outputs, torch.randn(64, 5).to(device))
        loss.backward()
        optimizer.step()
        done = step + 1
        if rank == 0 and done % 10 == 0:
            print(f"ddp_elastic: step {done}/{args.steps} loss {loss.item():.4f}", flush=True)
        if done % args.save_every == 0:
            if rank == 0:
                save_checkpoint(args.checkpoint, model, optimizer, done)
            dist.barrier()  # nobody runs ahead of the checkpoint it would resume from

    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    dist.destroy_process_group()
    print(
        f"ddp_elastic: rank {rank} of {world} finished {args.steps} steps, resumed from step "
        f"{start} (weights checksum {checksum:.10f})",
        flush=True,
    )


if __name__ == "__main__":
    main()
