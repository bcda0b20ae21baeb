#!/usr/bin/env bash
# usage: smoke.sh IMAGE [ARCH]
#
# A smoke test of a built image, meant for one built for another architecture and run
# under QEMU here (`make smoke ARCH=arm64`): the frameworks import, `entrypoint plan`
# plans a 2-node job, DeepSpeed's CPU Adam op loads prebuilt (no compiler in the image)
# and takes a step, and with CUDA torch the prebuilt CUDA ops hold kernels for A100 to Blackwell. Prints what it ran and how long each took; exits 1 on the first failure
# (a non-zero exit or a Python traceback).
set -euo pipefail
image=${1:?usage: smoke.sh IMAGE [ARCH]}
arch=${2:-$(dpkg --print-architecture 2>/dev/null || echo amd64)}
docker=${DOCKER:-docker}

run() {
  local what=$1; shift
  local start=$SECONDS
  # A traceback fails the step even when the exit status is 0 (Python reports an exception
  # raised in __del__ at exit, "Exception ignored", and still exits 0).
  if out=$("$docker" run --rm --platform "linux/$arch" "$@" 2>&1) && ! grep -q Traceback <<<"$out"; then
    printf '%-34s ok  (%3d s)  %s\n' "$what" $((SECONDS - start)) "$(tail -1 <<<"$out")"
  else
    printf '%-34s FAILED (%d s)\n%s\n' "$what" $((SECONDS - start)) "$out" >&2
    exit 1
  fi
}

echo "==> smoke test of $image ($arch)"
run "architecture" --entrypoint uname "$image" -m
run "import torch, jax, deepspeed" --entrypoint python "$image" -c \
  "import torch, jax, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| jax', jax.__version__, '| deepspeed', deepspeed.__version__)"
run "entrypoint plan (2 nodes)" -e NNODES=2 -e NODE_RANK=1 -e MASTER_ADDR=10.0.0.1 \
  -e MASTER_PORT=29500 "$image" plan
run "DeepSpeed's CPU Adam, prebuilt" -e DS_ACCELERATOR=cpu --entrypoint python "$image" -c "
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
p = torch.nn.Parameter(torch.ones(4))
opt = DeepSpeedCPUAdam([p], lr=0.1)
p.grad = torch.ones(4)
opt.step()
print('CPU Adam step: weights', p.data.tolist())"
# With CUDA torch, every prebuilt CUDA op holds cubins for A100 (sm_80), H100 (sm_90) and
# Blackwell (sm_100, sm_120) and PTX, read from its .so as `entrypoint doctor` reads them.
run "DeepSpeed's CUDA ops: kernels" --entrypoint python "$image" -c "
import torch
from entrypoint.doctor import cuda_kernels
ops = cuda_kernels.deepspeed_ops()
if torch.version.cuda is None:
    assert not ops, ('CUDA ops beside a CPU torch', ops)
    print('no CUDA op: torch', torch.__version__, 'is a CPU build')
else:
    short = [k.op for k in ops if not {80, 90, 100, 120} <= set(k.cubins) or not k.ptx]
    assert ops and not short, ('CUDA ops without sm_80/90/100/120 cubins or PTX', short, ops)
    print('; '.join(f'{k.op}: {k.text()}' for k in ops))"
echo "==> $image ($arch): smoke test passed"
