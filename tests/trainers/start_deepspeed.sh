#!/bin/bash
# A team's start script with DeepSpeed's own launcher, written for machine 0 of an old cluster
# (its hostfile, its address): the script reads --local_rank, which that launcher gives.
set -e
cd "$(dirname "$0")"
deepspeed --hostfile=/job/hostfile --num_nodes=2 --num_gpus=2 --master_addr=old-host.invalid \
    deepspeed_tutorial.py --deepspeed --deepspeed_config ds_config_tutorial.json
