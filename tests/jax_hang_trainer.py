"""JAX's multi-process guide as users write it (`jax.distributed.initialize()` with no
arguments), then a training loop of `pmap`'d steps whose gradients are averaged over every device
of every process, with one process misbehaving. Nothing of this project is imported, and nothing
says a step is done.

HANG_PROCESS, HANG_STEP: which process, at which step;
HANG_KIND: sleep (it sleeps for an hour, outside any collective), pause (it sleeps HANG_SECONDS,
then goes on), slow (it sleeps HANG_SECONDS before every step from HANG_STEP on);
COMPILE_SECONDS: the first step's compilation takes this much longer on every process (a host
callback while tracing, as a large model's first compilation takes minutes);
STEPS: steps in all (default 200); STEP_SECONDS: every process's own work a step (default 0.05).
"""

import functools
import os
import time

import jax
import jax.numpy as jnp

jax.distributed.initialize()
me = jax.process_index()
hang_process = int(os.environ.get("HANG_PROCESS", "-1"))
hang_step = int(os.environ.get("HANG_STEP", "20"))
kind = os.environ.get("HANG_KIND", "sleep")
seconds = float(os.environ.get("HANG_SECONDS", "20"))
compile_seconds = float(os.environ.get("COMPILE_SECONDS", "0"))
steps = int(os.environ.get("STEPS", "200"))
work = float(os.environ.get("STEP_SECONDS", "0.05"))


def loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


@functools.partial(jax.pmap, axis_name="batch")
def train_step(w, x, y):
    if compile_seconds:
        time.sleep(compile_seconds)  # runs once, while the step is traced
    grads = jax.lax.pmean(jax.grad(loss)(w, x, y), "batch")
    return w - 0.1 * grads, jax.lax.pmean(loss(w, x, y), "batch")


n = jax.local_device_count()
w = jnp.zeros((n, 4, 1))
key = jax.random.PRNGKey(me)
print(f"process {me} of {jax.process_count()} training", flush=True)
for step in range(steps):
    if me == hang_process and step == hang_step and kind == "sleep":
        time.sleep(3600)
    if me == hang_process and step == hang_step and kind == "pause":
        time.sleep(seconds)
    if me == hang_process and step >= hang_step and kind == "slow":
        time.sleep(seconds)
    time.sleep(work)  # the process's own work: loading its batch
    key, a, b = jax.random.split(key, 3)
    x = jax.random.normal(a, (n, 8, 4))
    w, value = train_step(w, x, x @ jnp.ones((4, 1)) + 0.01 * jax.random.normal(b, (n, 8, 1)))
    if step % 50 == 0:
        print(f"process {me} step {step} loss {float(value[0]):.4f}", flush=True)
print(f"process {me} done: {steps} steps, loss {float(value[0]):.4f}", flush=True)
jax.distributed.shutdown()
