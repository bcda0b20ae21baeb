"""For a trainer whose step is neither a torch optimizer's step, a `loss.backward()` nor a call
of a function it compiled with `jax.jit`/`jax.pmap` (those are counted with no change): call
`step()` once a training step, and `entrypoint run` sees this rank's progress as it sees a torch
trainer's (hangs named with their stacks, slow ranks, steps and goodput in `/metrics`). Outside
`entrypoint run` it does nothing.

    import entrypoint.progress
    for batch in data:
        state = train_step(state, batch)
        entrypoint.progress.step()
"""

from entrypoint.trainer_side.step_hook import step

__all__ = ["step"]
