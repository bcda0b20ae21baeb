"""A trainer sharded with FSDP2, as torch's FSDP2 tutorial writes it
(https://docs.pytorch.org/tutorials/intermediate/FSDP_tutorial.html): `fully_shard` on each
block, then on the root model, under torchrun's environment; gloo on CPU when no GPU is present.
Written as a user writes it: nothing from this project.

Run:  entrypoint run -- python fsdp2_trainer.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

STEPS = int(os.environ.get("FSDP_STEPS", "6"))


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.linear(x))


class Model(nn.Module):
    def __init__(self, width=16, depth=3):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda" if use_cuda else "cpu")
    torch.manual_seed(0)
    model = Model().to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(rank)
    for _ in range(STEPS):
        x = torch.randn(8, 16, device=device)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(
        f"fsdp2: rank {rank} of {world} trained {STEPS} steps, loss {loss.item():.4f}", flush=True
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
