"""JAX's multi-process example (https://docs.jax.dev/en/latest/multi_process.html):
`jax.distributed.initialize()` with no arguments, which finds the coordinator, the process
count and this process's id in its cluster environment; then a psum over every device of every
process, and `multihost_utils.process_allgather` of each process's index. One process per node.
Written as a user writes it: nothing from this project.

Run:  ENTRYPOINT_LAUNCHER=jax entrypoint run -- python jax_multiprocess.py
"""

import jax
from jax.experimental import multihost_utils

jax.distributed.initialize()

print(
    f"process {jax.process_index()} of {jax.process_count()}: "
    f"{jax.local_device_count()} local of {jax.device_count()} devices",
    flush=True,
)

# The psum is performed over all mapped devices across the processes.
xs = jax.numpy.ones(jax.local_device_count())
psum = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(xs)

indices = multihost_utils.process_allgather(jax.numpy.array([jax.process_index()]))

print(
    f"jax multi-process: process {jax.process_index()} of {jax.process_count()}, "
    f"psum {int(psum[0])}, allgather {[int(i) for i in indices.ravel()]}",
    flush=True,
)
jax.distributed.shutdown()
