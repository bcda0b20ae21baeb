"""torch's DDP tutorial loop (tests/trainers/ddp_tutorial.py) with one rank misbehaving, as a
user's trainer does: nothing of this project is imported.

HANG_RANK, HANG_STEP: which rank, at which step;
HANG_KIND: sleep (it sleeps for an hour, outside any collective), recv (it waits in a
`dist.recv` nobody sends), pause (it sleeps HANG_SECONDS, then goes on), slow (it sleeps
HANG_SECONDS before every forward from HANG_STEP on), evaluate (at HANG_STEP every rank
evaluates HANG_SECONDS / STEP_SECONDS batches of at least STEP_SECONDS each, as a Trainer does:
`model.eval()`, forward passes without gradients and an all-reduce of the loss, then trains on;
10 steps later again, and HANG_RANK, if any, sleeps for an hour inside that second evaluation);
STEPS: steps in all (default 200); STEP_SECONDS: every rank's own work a step (default 0.05);
PG_TIMEOUT: the process group's timeout in seconds, as a trainer passes it (default: torch's);
UPDATE: optimizer (default: torch.optim.SGD) or hand (no torch optimizer: the loop updates the
weights itself, `p -= lr * p.grad`, as a hand-written loop does).
"""

import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def evaluate(model, loss_fn, seconds, work, hang):
    model.eval()
    total = torch.zeros(1)
    with torch.no_grad():
        # A fixed evaluation set, as a Trainer's: the same batches on every rank (a loop that
        # ran until its own clock said so let ranks all-reduce different counts: a mismatch)
        for _ in range(max(1, round(seconds / work))):
            if hang:
                time.sleep(3600)
            time.sleep(work)
            total += loss_fn(model(torch.randn(20, 10)), torch.randn(20, 5))
            dist.all_reduce(total)
    model.train()


def main():
    pg_timeout = os.environ.get("PG_TIMEOUT")
    timeout = datetime.timedelta(seconds=float(pg_timeout)) if pg_timeout else None
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    hang_rank = int(os.environ.get("HANG_RANK", "-1"))
    hang_step = int(os.environ.get("HANG_STEP", "20"))
    kind = os.environ.get("HANG_KIND", "sleep")
    seconds = float(os.environ.get("HANG_SECONDS", "20"))
    steps = int(os.environ.get("STEPS", "200"))
    work = float(os.environ.get("STEP_SECONDS", "0.05"))
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    by_hand = os.environ.get("UPDATE", "optimizer") == "hand"
    optimizer = None if by_hand else optim.SGD(model.parameters(), lr=0.001)
    print(f"rank {rank} training", flush=True)
    for step in range(steps):
        if kind == "evaluate" and step == hang_step:
            evaluate(model, loss_fn, seconds, work, hang=False)
            print(f"rank {rank} evaluated", flush=True)
        if kind == "evaluate" and step == hang_step + 10:
            evaluate(model, loss_fn, seconds, work, hang=rank == hang_rank)
        if rank == hang_rank and step == hang_step:
            if kind == "sleep":
                time.sleep(3600)
            elif kind == "recv":
                dist.recv(torch.zeros(1), src=(rank + 1) % dist.get_world_size())
            elif kind == "pause":
                time.sleep(seconds)
        if rank == hang_rank and kind == "slow" and step >= hang_step:
            time.sleep(seconds)
        time.sleep(work)
        if optimizer is not None:
            optimizer.zero_grad()
        outputs = model(torch.randn(20, 10))
        loss_fn(outputs, torch.randn(20, 5)).backward()
        if optimizer is not None:
            optimizer.step()
            continue
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.001 * p.grad
                p.grad = None
    dist.destroy_process_group()
    print(f"rank {rank} finished {steps} steps", flush=True)


if __name__ == "__main__":
    main()
