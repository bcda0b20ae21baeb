"""A small real trainer for the supervision tests: gloo all-reduces in a loop, a 'checkpoint'
(the last step, in <FAULT_OUT>/ckpt) that a restart resumes from, and faults on request.

FAULT_OUT       directory for ckpt and the per-rank reports (rank<R>.json)
FAULT_STEPS     steps to run (default 400; each step sleeps FAULT_STEP_SECONDS, default 0.05)
FAULT_CRASH     "<rank>:<step>": that rank raises at that step, on the first start only
FAULT_CRASH_SAY text added to that exception's message (a secret's value, to see it masked)
FAULT_DUMP      "1": that rank first writes <TORCH_FR_DUMP_TEMP_FILE><rank> (or the old name's,
                TORCH_NCCL_DEBUG_INFO_TEMP_FILE), as NCCL dumps each rank's Flight Recorder when
                a collective times out (no NCCL here)
FAULT_EXIT      "<rank>:<step>:<code>": that rank exits with that code (or "abort": os.abort(),
                as XLA and NCCL do on a fatal error) at that step, on the first start only; it
                writes <FAULT_OUT>/exiting<rank> first
FAULT_HANG      "<rank>:<step>,...": those ranks hang at that step, deaf to SIGTERM (as a rank stuck
                in an NCCL collective is)
FAULT_WAIT      "<rank>:<step>,...": those ranks wait at that step (outside any collective) until a
                signal comes, then record it and exit 128 + its number
FAULT_NOISE     lines of 100 characters each rank writes to stderr every step
Every signal a rank receives is appended to <FAULT_OUT>/signals<rank> (one number a line).
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

out = Path(os.environ["FAULT_OUT"])
out.mkdir(parents=True, exist_ok=True)
steps = int(os.environ.get("FAULT_STEPS", "400"))
pause = float(os.environ.get("FAULT_STEP_SECONDS", "0.05"))
crash = os.environ.get("FAULT_CRASH", "")
exit_at = os.environ.get("FAULT_EXIT", "")
noise = int(os.environ.get("FAULT_NOISE", "0"))
hang = os.environ.get("FAULT_HANG", "").split(",")
wait_at = os.environ.get("FAULT_WAIT", "").split(",")
waiting = False
restart = int(os.environ.get("ENTRYPOINT_RESTART_COUNT", "0"))
stop_signal = None
signal_at = None  # when a signal reached this rank itself (not through the shared flag)


def on_signal(number, _frame):
    global stop_signal, signal_at
    with open(out / f"signals{os.environ.get('RANK', '?')}", "a") as seen:
        seen.write(f"{number}\n")
    if waiting:
        os._exit(128 + number)
    if number in (signal.SIGTERM, signal.SIGUSR1):
        stop_signal = number
        signal_at = signal_at or time.time()


for sig in (
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGABRT,
    signal.SIGSEGV,
    signal.SIGINT,
    signal.SIGHUP,
):
    signal.signal(sig, on_signal)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckpt = out / "ckpt"
start = int(ckpt.read_text()) if ckpt.exists() else 0
print(f"rank {rank}/{world} starts at step {start} (restart {restart})", flush=True)
(out / f"started{rank}.{restart}").write_text(str(os.getpid()))
# The job token's variables this worker sees: none (they are the entrypoints').
(out / f"token_env{rank}").write_text(json.dumps(sorted(k for k in os.environ if "JOB_TOKEN" in k)))
signals_seen = []
step = start
for step in range(start + 1, steps + 1):
    if crash and restart == 0 and crash == f"{rank}:{step}":
        if os.environ.get("FAULT_DUMP") == "1":
            prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
            prefix = prefix or os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
            Path(prefix + str(rank)).write_bytes(b"a dump")
        raise ValueError(
            f"injected failure on rank {rank} at step {step}"
            + os.environ.get("FAULT_CRASH_SAY", "")
        )
    if exit_at and restart == 0 and exit_at.startswith(f"{rank}:{step}:"):
        code = exit_at.split(":")[2]
        (out / f"exiting{rank}").write_text(code)
        if code == "abort":
            os.abort()
        os._exit(int(code))
    if restart == 0 and f"{rank}:{step}" in wait_at:
        waiting = True
        time.sleep(3600)
    if restart == 0 and f"{rank}:{step}" in hang:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)
    for _ in range(noise):
        print(f"rank {rank} step {step} " + "n" * 80, file=sys.stderr)
    flag = torch.tensor([0 if stop_signal is None else stop_signal])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # a signal on any rank stops every rank
    if flag.item():
        signals_seen.append(int(flag.item()))
        if rank == 0:
            ckpt.write_text(str(step - 1))
        break
    value = torch.ones(1)
    dist.all_reduce(value)
    time.sleep(pause)
    if rank == 0 and step % 20 == 0:
        ckpt.write_text(str(step))
report = {
    "rank": rank,
    "world_size": world,
    "start": start,
    "last_step": step,
    "restart": restart,
    "signal": signals_seen[0] if signals_seen else None,
    "signal_at": signal_at,
}
(out / f"rank{rank}.json").write_text(json.dumps(report))
dist.destroy_process_group()
sys.exit(128 + signals_seen[0] if signals_seen else 0)
