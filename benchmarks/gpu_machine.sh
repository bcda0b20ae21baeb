#!/usr/bin/env bash
# The GPU checks, on a machine with one NVIDIA GPU and no Docker: the machine's own torch and
# JAX, the entrypoint from this checkout, DeepSpeed built there from its sdist with FusedAdam
# compiled in (as the image's build does), the image's prebuilt ops read by doctor. Prints
# figures and keeps every log in OUT; asserts nothing. docs/benchmarks.md has its last figures.
#
#   OUT=/tmp/gpu WHEELS=.whl benchmarks/gpu_machine.sh
#
# WHEELS holds what the machine lacks: the pure-Python wheels of the lock (pydantic,
# pydantic-settings, structlog, hjson...), src/deepspeed-*.tar.gz, and ops/*.so: the image's
# prebuilt DeepSpeed ops (docker cp from multinode:dev's deepspeed/ops/). Parts:
#   doctor    entrypoint doctor --json (GPU, NVML, driver, architecture, the image's ops)
#   kernels   the image's FusedAdam cubins and PTX loaded by this GPU's driver (CuPy), timed
#   deepspeed the built-in DeepSpeed job, NCCL, 1 node: a worker fails at step 30, the
#             restart resumes from the checkpoint; /metrics scraped while it trains
#   jax       the built-in JAX job on the GPU
#   allreduce entrypoint doctor --allreduce (NCCL, one rank)
#   flight    NCCL's Flight Recorder read and summed up as a rank answers a hang (one rank:
#             NCCL will not put two ranks on one GPU), its entries and the time to read them
#   health    the checks before a start against this GPU's NVML (timed), its readings (ECC,
#             row remapping, NVLinks, fabric domain), NVML's event wait for 20 s: no event
#             expected on a healthy GPU; the deepspeed part also counts health lines in its log
#   spare     2 nodes + 1 spare on loopback sharing the GPU (benchmarks/gpu_trainer.py: DDP
#             over gloo), node 1 killed: the spare takes rank 1, seconds to training again;
#             entrypoint status and /metrics with the GPU's NVML figures while it trains
set -uo pipefail
scrape() { python3 -c "import sys, urllib.request as u; sys.stdout.write(u.urlopen('http://127.0.0.1:$1/metrics', timeout=5).read().decode())"; }
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu-machine}
WHEELS=$(cd "${WHEELS:-.whl}" && pwd) || exit 1
PARTS=${PARTS:-doctor health kernels deepspeed jax allreduce flight spare}  # GPUS=0: the spare part on CPU (a dry run)
mkdir -p "$OUT"
repo=$PWD
say() { printf '\n== %s (%s s)\n' "$*" "$SECONDS"; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

say setup
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$repo PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
python3 -c 'import torch, jax; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "nccl", ".".join(map(str, torch.cuda.nccl.version())), "| jax", jax.__version__, jax.devices())'

# DeepSpeed from its sdist with FusedAdam compiled in, for this GPU's architecture only.
if has deepspeed || has doctor; then
  say "DeepSpeed wheel with FusedAdam (docker/deepspeed_ops.py wheel)"
  rm -rf /tmp/dsrc /tmp/dswheel && mkdir -p /tmp/dsrc
  tar -xzf "$WHEELS"/src/deepspeed-*.tar.gz -C /tmp/dsrc --strip-components=1
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)
  t0=$SECONDS
  (cd /tmp && DS_ACCELERATOR=cuda DS_BUILD_OPS=0 DS_BUILD_FUSED_ADAM=1 TORCH_CUDA_ARCH_LIST=$cap \
    MAX_JOBS=16 python3 "$repo/docker/deepspeed_ops.py" wheel /tmp/dsrc /tmp/dswheel \
    >"$OUT/ds-build.log" 2>&1) || { tail -30 "$OUT/ds-build.log"; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/dswheel/*.whl
  echo "built and installed in $((SECONDS - t0)) s"
  python3 "$repo/docker/deepspeed_ops.py" check fused_adam
  python3 -c "import time; t = time.perf_counter(); import deepspeed
from deepspeed.ops.op_builder import FusedAdamBuilder; t1 = time.perf_counter(); FusedAdamBuilder().load()
print(f'FusedAdam loaded without a build in {time.perf_counter() - t1:.3f} s (import deepspeed {t1 - t:.1f} s)')"
fi

if has doctor; then
  say "doctor --json, the image's prebuilt ops beside DeepSpeed"
  ops=/tmp/site/deepspeed/ops/image_prebuilt && mkdir -p "$ops" && cp "$WHEELS"/ops/*.so "$ops"/
  timeout 120 python3 -m entrypoint doctor --json >"$OUT/doctor.json" 2>"$OUT/doctor.err"
  echo "exit $?"
  python3 - "$OUT/doctor.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({k: d[k] for k in ("gpus", "kernels", "problems", "ok") if k in d})[:3000])
PY
  timeout 120 python3 -m entrypoint doctor >"$OUT/doctor.txt" 2>&1
  grep -v "^  *[A-Z_]*=" "$OUT/doctor.txt" | head -40
  rm -rf "$ops"
  say "doctor --json promised 2 GPUs on a node that has 1"
  ENTRYPOINT_GPUS_PER_NODE=2 timeout 60 python3 -m entrypoint doctor --json >"$OUT/doctor2.json" 2>&1
  echo "exit $?"; grep -o '"problems": \[[^]]*\]' "$OUT/doctor2.json" | cut -c1-600
fi

if has kernels; then
  say "the image's FusedAdam kernels on this GPU's driver"
  python3 - "$WHEELS"/ops <<'PY'
import glob, os, subprocess, sys, tempfile, time
os.environ["CUDA_CACHE_DISABLE"] = "1"  # the PTX compile timed, not read from the cache
import cupy
so = [p for p in glob.glob(sys.argv[1] + "/fused_adam*.so")][0]
tmp = tempfile.mkdtemp()
subprocess.run(["cuobjdump", "-xelf", "all", so], cwd=tmp, check=True, capture_output=True)
subprocess.run(["cuobjdump", "-xptx", "all", so], cwd=tmp, check=True, capture_output=True)
print(subprocess.run(["cuobjdump", "--list-elf", "--list-ptx", so], capture_output=True, text=True).stdout)
cupy.cuda.Device(0).use()
for f in sorted(os.listdir(tmp)):
    t = time.perf_counter()
    try:
        m = cupy.cuda.function.Module()
        m.load_file(os.path.join(tmp, f))
        print(f"{f}: loaded in {1000 * (time.perf_counter() - t):.1f} ms")
    except Exception as e:
        print(f"{f}: {type(e).__name__}: {str(e)[:120]}")
PY
fi

if has deepspeed; then
  say "built-in DeepSpeed job, NCCL on the GPU, a failure at step 30 and a restart"
  rm -rf /tmp/dsjob
  t0=$EPOCHREALTIME
  ENTRYPOINT_JOB_STEPS=60 ENTRYPOINT_JOB_LOG_EVERY=5 ENTRYPOINT_JOB_SAVE_EVERY=25 \
  ENTRYPOINT_JOB_FAIL_AT_STEP=30 ENTRYPOINT_MAX_RESTARTS=1 ENTRYPOINT_JOB_OUTPUT=/tmp/dsjob \
  ENTRYPOINT_METRICS_PORT=29702 ENTRYPOINT_LOG_FORMAT=console \
    timeout 300 python3 -m entrypoint run >"$OUT/deepspeed.log" 2>&1 &
  job=$!
  while kill -0 $job 2>/dev/null; do  # the last scrape before the end
    scrape 29702 >/tmp/metrics.txt 2>/dev/null && mv /tmp/metrics.txt "$OUT/deepspeed-metrics.txt"
    sleep 2
  done
  wait $job; echo "exit $? after $(since "$t0") s"
  grep -E "\[job\]|FusedAdam|fused_adam|restart|Time to load|injected" \
    "$OUT/deepspeed.log" | cut -c1-220 | head -40
  grep -E '^multinode_(node_up|node_gpu|job_restarts)' "$OUT/deepspeed-metrics.txt" | head -12
  echo "health lines in the job's log (none on a healthy GPU): $(grep -ciE 'health|XID' "$OUT/deepspeed.log")"
  grep -E '^multinode_node_(health|unhealthy)' "$OUT/deepspeed-metrics.txt" | head -5
fi

if has health; then
  say "health: the checks before a start, the GPU's readings, NVML's event wait"
  timeout 120 python3 - <<'PY'
import time
import pynvml
from entrypoint.supervise import health
t = time.perf_counter()
failed = health.before_start(("0",), health.plan_links({"NCCL_SOCKET_IFNAME": "^lo,docker"}),
                             [("ENTRYPOINT_CHECKPOINT_DIR", __import__("pathlib").Path("/tmp"), True)],
                             None, 60)
print(f"checks before a start: {[f.line() for f in failed]} in {time.perf_counter() - t:.3f} s")
nvml = health.load_nvml(("0",))
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
print("reading:", health.gpu_reading(nvml, handle))
print("NVLink domain:", repr(health.nvlink_domain(("0",))))
events = []
t = time.perf_counter()
watch = health.Watch(("0",), {}, events.append)
print(f"watch started in {time.perf_counter() - t:.3f} s; NVML event set: {watch.events is not None}")
time.sleep(20)
watch.stop()
print(f"events in 20 s: {events}")
PY
fi

if has jax; then
  say "built-in JAX job on the GPU"
  rm -rf /tmp/jaxjob  # a fresh start each run (a kept checkpoint made the second run train 0 steps)
  t0=$EPOCHREALTIME
  ENTRYPOINT_JOB=jax ENTRYPOINT_JOB_STEPS=60 ENTRYPOINT_JOB_LOG_EVERY=10 ENTRYPOINT_JOB_OUTPUT=/tmp/jaxjob \
  ENTRYPOINT_LOG_FORMAT=console timeout 300 python3 -m entrypoint run >"$OUT/jax.log" 2>&1
  echo "exit $? after $(since "$t0") s"
  grep -E "\[job\]|devices|backend" "$OUT/jax.log" | cut -c1-220 | head -20
fi

if has allreduce; then
  say "doctor --allreduce"
  timeout 180 python3 -m entrypoint doctor --allreduce >"$OUT/allreduce.log" 2>&1
  echo "exit $?"; grep -A12 "^all-reduce" "$OUT/allreduce.log"
fi

if has flight; then
  say "NCCL's Flight Recorder summed up as a hung rank's answer (trainer_side/flight.py)"
  TORCH_FR_BUFFER_SIZE=2000 timeout 120 python3 - >"$OUT/flight.log" 2>&1 <<'PY'
import os, time, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29850")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
for n in (1, 1 << 10, 1 << 20):
    dist.all_reduce(torch.ones(n, device="cuda"))
torch.cuda.synchronize()
from entrypoint.trainer_side import flight
start = time.perf_counter()
entries = flight._entries()
print(f"{len(entries)} entries read in {(time.perf_counter() - start) * 1e3:.1f} ms")
print("summary:", flight.summary(entries))
dist.destroy_process_group()
PY
  echo "exit $?"; tail -3 "$OUT/flight.log"
fi

if has spare; then
  say "2 nodes + 1 spare sharing the GPU, node 1 killed"
  rm -rf /tmp/gpu-spare && mkdir -p /tmp/gpu-spare
  for r in 0 1 2; do
    NNODES=3 NODE_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29800 ENTRYPOINT_SPARES=1 \
    ENTRYPOINT_GPUS_PER_NODE=${GPUS:-1} ENTRYPOINT_NPROC_PER_NODE=1 ENTRYPOINT_SOCKET_IFNAME=lo ENTRYPOINT_RUN_DIR=/tmp/gpu-spare/run \
    ENTRYPOINT_LOG_FORMAT=console GPU_OUT=/tmp/gpu-spare GPU_STEPS=${GPU_STEPS:-3000} \
      setsid python3 -m entrypoint run -- python3 "$repo/benchmarks/gpu_trainer.py" \
      >"$OUT/spare-node$r.log" 2>&1 &
    echo $! >"/tmp/gpu-spare/pid$r"
  done
  step() { grep -o '\[gpu-trainer\] step [0-9]*' "$OUT/spare-node0.log" | tail -1 | grep -o '[0-9]*$'; }
  alive() { kill -0 "$(cat /tmp/gpu-spare/pid0)" 2>/dev/null; }
  for _ in $(seq 240); do { [ "$(step)" -ge 200 ] 2>/dev/null || ! alive; } && break; sleep 0.5; done
  alive || { echo "node 0 ended before step 200:"; tail -5 "$OUT/spare-node0.log"; PARTS=; }
fi
if has spare; then
  sleep 12  # one GPU figure (every 10 s) from every node
  scrape 29802 >"$OUT/spare-metrics.txt"
  timeout 20 python3 -m entrypoint status 127.0.0.1:29802 --json >"$OUT/status.json"; echo "status exit $?"
  timeout 20 python3 -m entrypoint status 127.0.0.1:29802 --once 2>&1 | head -12
  before=$(step); t0=$EPOCHREALTIME
  kill -9 -- -"$(cat /tmp/gpu-spare/pid1)"
  echo "killed node 1 at step $before, $(date -u +%H:%M:%S.%N)"
  n0=$(grep -c 'starts at step' "$OUT/spare-node0.log")
  resumed() {  # a step line after a start beyond the first n0
    awk -v n0="$n0" '/starts at step/ {n++; s=0} /\[gpu-trainer\] step/ {s=1}
      END {exit !(n > n0 && s)}' "$OUT/spare-node0.log"
  }
  for _ in $(seq 600); do
    resumed && break
    alive || break
    sleep 0.05
  done
  echo "training again (node 0's first step after the resume) $(since "$t0") s after the kill"
  wait "$(cat /tmp/gpu-spare/pid0)" "$(cat /tmp/gpu-spare/pid2)" 2>/dev/null
  for r in 0 2; do echo "node $r: $(tail -1 "$OUT/spare-node$r.log" | cut -c1-200)"; done
  grep -E "takes node rank|lost node|standby|restart|starts at step" "$OUT/spare-node0.log" | cut -c1-200 | head
  cat /tmp/gpu-spare/rank*.json; echo
  grep -E '^multinode_(node_up|node_state|node_gpu|node_slow|job_spares|job_restarts)' "$OUT/spare-metrics.txt" | head -30
  grep -i "slow" "$OUT/spare-node0.log" | head -3
fi
say "done"
