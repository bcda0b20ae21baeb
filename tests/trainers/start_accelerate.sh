#!/bin/bash
# A team's start script as seed 004's users keep one: accelerate with the config file written on
# machine 0 of another cluster (its CPU form: MULTI_CPU, 4 processes on 2 machines, its address).
set -e
cd "$(dirname "$0")"
accelerate launch --config_file accelerate_multi_cpu.yaml accelerate_quicktour.py
