#!/bin/bash
# A wrapper a team runs first (its environment, its logs), which starts the machine-0 script.
bash "$(dirname "$0")/start_machine0.sh"
