"""DeepSpeed's own getting-started shape (https://www.deepspeed.ai/getting-started/): argparse
with `--local_rank` (DeepSpeed's launcher passes it) and `deepspeed.add_config_arguments`,
`deepspeed.initialize(args=...)` with the config file named on the command line,
`model_engine.backward(loss)` and `model_engine.step()`. Written for
`deepspeed --num_gpus N deepspeed_tutorial.py --deepspeed --deepspeed_config ds.json`, as a user
writes it: nothing from this project. Here on CPU (the image's prebuilt ops): ZeRO-2 with
torch's AdamW, passed in, as DeepSpeed's CPU examples do.
"""

import argparse
import os

import deepspeed
import torch
import torch.distributed as dist
from torch import nn


def main():
    parser = argparse.ArgumentParser(description="DeepSpeed getting started")
    parser.add_argument("--local_rank", type=int, default=-1, help="from the launcher")
    parser.add_argument("--steps", type=int, default=10)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    assert args.local_rank == int(os.environ["LOCAL_RANK"]), (args.local_rank, os.environ)

    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)

    generator = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(args.steps):
        inputs = torch.randn(engine.train_micro_batch_size_per_gpu(), 16, generator=generator)
        targets = (inputs[:, :8].sum(dim=1) > 0).long()
        loss = nn.functional.cross_entropy(engine(inputs), targets)
        engine.backward(loss)
        engine.step()
    checksum = sum(p.detach().float().sum().item() for p in engine.module.parameters())
    print(
        f"deepspeed tutorial: rank {dist.get_rank()} of {dist.get_world_size()} local_rank "
        f"{args.local_rank} took {engine.global_steps} steps (weights checksum {checksum:.6f})",
        flush=True,
    )


if __name__ == "__main__":
    main()
