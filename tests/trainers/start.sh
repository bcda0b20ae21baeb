#!/bin/bash
# A team's start script, as seed 004's users keep one: its own torchrun, written for one machine.
set -e
cd "$(dirname "$0")"
exec torchrun --standalone --nproc-per-node=2 ddp_tutorial.py
