"""The image's built-in training job: what `docker run IMAGE` trains when no command is given.

A tiny transformer language model learns a synthetic "language" (a sparse Markov chain,
generated deterministically from a seed, see `data.py`), so that the loss visibly falls
within a few dozen steps on CPU and every number is reproducible.

- `python -m entrypoint.job`: DeepSpeed ZeRO stage 2 through the config the entrypoint chose
  (ENTRYPOINT_DEEPSPEED_CONFIG), one worker per GPU (or CPU worker) started by torchrun.
- `python -m entrypoint.job.jax_train`: JAX data parallel, one process per node owning all of
  its devices, joined by jax.distributed.

Both take the same settings (`--help`), resume from the last checkpoint in the output
directory, and end with one results file per worker: `<output>/results/rank<R>.json`.

This package stays import-light: the entrypoint looks its modules up on the launch path, so
nothing here imports torch, deepspeed or jax at package import. It runs in the trainer's
interpreter and imports `plan.configs` only (the shipped configs); never `control`,
`supervise`, `render`, `local`, `doctor` or `cli`.
"""
