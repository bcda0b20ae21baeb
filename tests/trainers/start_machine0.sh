#!/bin/bash
# A team's start script as seed 002's users keep one: written on machine 0 of a cluster long
# gone (its node rank, its address), run as is on every node.
set -e
cd "$(dirname "$0")"
torchrun --nnodes=2 --node_rank=0 --master_addr=old-host.invalid --master_port=29500 \
    --nproc-per-node=2 ddp_tutorial.py
echo "start_machine0.sh: done"
