"""torch's "Getting Started with Distributed Data Parallel" tutorial, as its multi-node section
runs it under torchrun (https://docs.pytorch.org/tutorials/intermediate/ddp_tutorial.html,
elastic_ddp.py): init_process_group reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from
the environment that torchrun sets; a toy model in DDP, a few SGD steps. On CPU with gloo when
no GPU is present. Written as a user writes it: nothing from this project.

Run:  entrypoint run -- python ddp_tutorial.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 5


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic():
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.", flush=True)
    if use_cuda:
        device_id = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(device_id)
        model = ToyModel().to(device_id)
        ddp_model = DDP(model, device_ids=[device_id])
    else:
        device_id = "cpu"
        model = ToyModel()
        ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    torch.manual_seed(rank)  # every rank its own data: equal weights below prove the all-reduce
    for _ in range(STEPS):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10).to(device_id))
        labels = torch.randn(20, 5).to(device_id)
        loss_fn(outputs, labels).backward()
        optimizer.step()

    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    world = dist.get_world_size()
    dist.destroy_process_group()
    print(
        f"Finished running basic DDP example on rank {rank} of {world} "
        f"(weights checksum {checksum:.10f}).",
        flush=True,
    )


if __name__ == "__main__":
    demo_basic()
