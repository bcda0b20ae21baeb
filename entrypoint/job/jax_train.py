"""The built-in JAX job: the same tiny transformer LM and task, data parallel with jax.distributed.

One process per node owns all of the node's devices (the entrypoint sets JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID and, on GPU, JAX_LOCAL_DEVICE_IDS). The batch is sharded over a
one-axis mesh of every device in the job; XLA inserts the gradient all-reduce. Process 0 writes
the checkpoints (weights and Adam state are replicated), <output>/jax-checkpoints/step<N>.npz.

Usage: python -m entrypoint.job.jax_train [--steps N] [--output DIR] (see --help).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from entrypoint.job import harness
from entrypoint.job.data import batches, make_task
from entrypoint.trainer_side import step_hook

DESCRIPTION = (
    "The image's built-in JAX job: a tiny transformer language model on a synthetic "
    "Markov-chain language, data parallel across processes with jax.distributed."
)
D_MODEL, LAYERS, HEADS = 64, 2, 4


def initialize_distributed(jax: ModuleType, processes: int, process_id: int) -> None:
    """Join the job: jax.distributed reads the coordinator address and local device ids from the
    environment itself, but not the process count and id."""
    if processes <= 1:
        return
    kwargs: dict[str, object] = {"num_processes": processes, "process_id": process_id}
    if "cluster_detection_method" in inspect.signature(jax.distributed.initialize).parameters:
        kwargs["cluster_detection_method"] = "deactivate"  # we know everything: no SLURM guessing
    jax.distributed.initialize(**kwargs)


def init_params(jax: ModuleType, key: Any, vocab: int, seq_len: int) -> dict:
    jnp = jax.numpy
    keys = iter(jax.random.split(key, 4 + 4 * LAYERS))

    def dense(n_in: int, n_out: int) -> Any:
        return jax.random.normal(next(keys), (n_in, n_out)) * (1.0 / math.sqrt(n_in))

    def norm() -> dict[str, Any]:
        return {"scale": jnp.ones(D_MODEL), "bias": jnp.zeros(D_MODEL)}

    return {
        "embed": jax.random.normal(next(keys), (vocab, D_MODEL)),
        "position": jax.random.normal(next(keys), (seq_len, D_MODEL)) * 0.02,
        "blocks": [
            {
                "norm1": norm(),
                "qkv": dense(D_MODEL, 3 * D_MODEL),
                "proj": dense(D_MODEL, D_MODEL),
                "norm2": norm(),
                "up": dense(D_MODEL, 4 * D_MODEL),
                "down": dense(4 * D_MODEL, D_MODEL),
            }
            for _ in range(LAYERS)
        ],
        "norm": norm(),
        "head": dense(D_MODEL, vocab),
    }


def loss_fn(jax: ModuleType, params: dict[str, Any], tokens: Any) -> Any:
    jnp = jax.numpy
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    b, t = inputs.shape

    def layer_norm(x: Any, p: dict[str, Any]) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * p["scale"] + p["bias"]

    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    h = params["embed"][inputs] + params["position"][:t]
    for block in params["blocks"]:
        qkv = layer_norm(h, block["norm1"]) @ block["qkv"]
        q, k, v = (x.reshape(b, t, HEADS, -1) for x in jnp.split(qkv, 3, axis=-1))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D_MODEL // HEADS)
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        h = h + jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, D_MODEL) @ block["proj"]
        h = h + jax.nn.gelu(layer_norm(h, block["norm2"]) @ block["up"]) @ block["down"]
    logits = layer_norm(h, params["norm"]) @ params["head"]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def optimizer_settings(config: dict) -> dict:
    """Adam(W) settings from the DeepSpeed config the entrypoint chose, so both jobs agree."""
    params = config.get("optimizer", {}).get("params", {})
    betas = params.get("betas", (0.9, 0.95))
    return {
        "lr": float(params.get("lr", 1e-3)),
        "b1": float(betas[0]),
        "b2": float(betas[1]),
        "eps": float(params.get("eps", 1e-8)),
        "weight_decay": float(params.get("weight_decay", 0.0)),
        "clip": float(config.get("gradient_clipping", 0.0) or 0.0),
    }


def make_train_step(jax: ModuleType, opt: dict) -> Callable[..., Any]:
    jnp = jax.numpy
    tree = jax.tree_util

    def step(
        params: dict[str, Any], state: dict[str, Any], tokens: Any
    ) -> tuple[dict[str, Any], dict[str, Any], Any]:
        loss, grads = jax.value_and_grad(lambda p: loss_fn(jax, p, tokens))(params)
        if opt["clip"] > 0:
            norm = jnp.sqrt(sum(jnp.sum(g * g) for g in tree.tree_leaves(grads)))
            grads = tree.tree_map(
                lambda g: g * jnp.minimum(1.0, opt["clip"] / (norm + 1e-6)), grads
            )
        count = state["count"] + 1
        mu = tree.tree_map(lambda m, g: opt["b1"] * m + (1 - opt["b1"]) * g, state["mu"], grads)
        nu = tree.tree_map(lambda v, g: opt["b2"] * v + (1 - opt["b2"]) * g * g, state["nu"], grads)
        c1, c2 = 1 - opt["b1"] ** count, 1 - opt["b2"] ** count
        params = tree.tree_map(
            lambda p, m, v: (
                p
                - opt["lr"] * ((m / c1) / (jnp.sqrt(v / c2) + opt["eps"]) + opt["weight_decay"] * p)
            ),
            params,
            mu,
            nu,
        )
        return params, {"count": count, "mu": mu, "nu": nu}, loss

    return jax.jit(step, donate_argnums=(0, 1))


def save_checkpoint(
    jax: ModuleType, directory: Path, step: int, params: Any, state: Any, meta: dict
) -> Path:
    """Process 0 only: params and Adam state are replicated, so its local copy is the whole."""
    leaves = jax.tree_util.tree_leaves((params, state))
    arrays: dict[str, Any] = {
        f"leaf{i}": np.asarray(leaf.addressable_data(0)) for i, leaf in enumerate(leaves)
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step{step}.npz"
    tmp = directory / f".step{step}.npz.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    tmp.replace(path)
    (directory / "latest.tmp").write_text(json.dumps(meta | {"step": step, "file": path.name}))
    (directory / "latest.tmp").replace(directory / "latest")
    return path


def find_checkpoint(directory: Path, global_batch: int) -> tuple[int, Path | None, str]:
    """(step or -1, the file, why). Weights and Adam's state are replicated: a checkpoint of
    another global batch (a spare with other GPUs, a shrink, a grow back to a size the config's
    batch does not divide alike) resumes too, `why` saying how the batch changed."""
    try:
        meta = json.loads((directory / "latest").read_text())
    except (OSError, ValueError):
        return -1, None, f"no checkpoint in {directory}"
    path = directory / meta.get("file", "")
    if not path.is_file():
        return -1, None, f"{path} is missing here: is the output directory shared by every node?"
    if meta.get("global_batch") != global_batch:
        return (
            int(meta["step"]),
            path,
            f"{path} was trained with global batch {meta.get('global_batch')}, this start has "
            f"{global_batch} (the world size changed): resuming it with the new batch",
        )
    return int(meta["step"]), path, str(path)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = harness.parse_args(argv, "python -m entrypoint.job.jax_train", DESCRIPTION)
    processes = int(os.environ.get("JAX_NUM_PROCESSES", "1"))
    process_id = int(os.environ.get("JAX_PROCESS_ID", "0"))
    plan = harness.read_plan()
    if plan.get("device", "cpu") == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")

    stop = harness.StopRequest()
    import jax

    try:  # cross-process collectives on CPU (gloo is the default in newer JAX); before any backend
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, ValueError):
        pass
    initialize_distributed(jax, processes, process_id)
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    console = harness.Console(jax.process_index(), prefix="jax job")
    place = harness.Place.from_env("JAX_PROCESS_ID", "JAX_NUM_PROCESSES")
    backend = jax.default_backend()
    device = "cuda" if backend == "gpu" else backend
    if plan.get("device") == "cuda" and device != "cuda":
        raise SystemExit(
            f"[jax job] ERROR: the plan says device cuda but JAX's backend is "
            f"{backend} (jax {jax.__version__}): install jax[cuda12] and start the "
            "container with --gpus all, or set ENTRYPOINT_DEVICE=cpu"
        )
    devices = jax.devices()
    config, config_from = harness.deepspeed_config(len(devices), device)
    opt = optimizer_settings(config)
    global_batch = int(config.get("train_batch_size", 16))
    if global_batch % len(devices):
        global_batch = len(devices) * max(1, global_batch // len(devices))
    local_batch = global_batch // processes

    mesh = Mesh(np.array(devices), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    sharded = NamedSharding(mesh, PartitionSpec("data"))
    task = make_task(args.seed)
    console.log(
        f"{processes} processes, {len(devices)} {backend} devices "
        f"({jax.local_device_count()} per process), jax {jax.__version__}; global batch "
        f"{global_batch} sharded over a data mesh; Adam lr {opt['lr']} (config {config_from})"
    )

    def put(
        tree: Any,
    ) -> Any:  # the same host values on every process -> one replicated global array
        return jax.tree_util.tree_map(
            lambda x: jax.make_array_from_callback(
                np.shape(x), replicated, lambda index: np.asarray(x)[index]
            ),
            tree,
        )

    template = init_params(jax, jax.random.PRNGKey(args.seed), task.vocab, task.seq_len)
    n_params = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(template))
    zeros = jax.tree_util.tree_map(np.zeros_like, template)
    host_params, host_state = template, {"count": np.zeros((), np.int32), "mu": zeros, "nu": zeros}
    console.log(
        f"model: tiny transformer LM, {n_params:,} parameters; loss floor {task.floor:.3f} "
        f"(guessing: {math.log(task.vocab):.3f})"
    )

    directory = args.output / "jax-checkpoints"
    step_seen, path, why = (
        find_checkpoint(directory, global_batch)
        if args.resume == "auto"
        else (-1, None, "--resume never")
    )
    seen = np.asarray(multihost_utils.process_allgather(np.array([step_seen], np.int64))).ravel()
    start, resumed_from, checkpoint = 0, None, None
    if step_seen >= 0 and path is not None and (seen == step_seen).all():
        with np.load(path) as stored:
            leaves = [stored[f"leaf{i}"] for i in range(len(stored.files))]
        host_params, host_state = jax.tree_util.tree_unflatten(
            jax.tree_util.tree_structure((host_params, host_state)), leaves
        )
        start = resumed_from = step_seen
        checkpoint = str(path)
        console.log(f"resuming from checkpoint {path} (step {start})")
        if why != str(path):
            console.warn(why)
    else:
        if (seen >= 0).any():
            why = (
                "not every process can read the same checkpoint (is the output directory "
                "shared by every node?)"
            )
        console.log(f"starting fresh: {why}")
        if moved := harness.move_aside(directory, place.node_rank):  # one process per node
            console.warn(f"moved the old checkpoints aside to {moved}")
        multihost_utils.sync_global_devices("entrypoint-job-fresh")

    harness.drop_stale_results(args.results, processes)
    params, state = put(host_params), put(host_state)
    train_step = make_train_step(jax, opt)
    stream = batches(len(task.tokens), process_id, processes, local_batch, args.seed, start)
    eval_loss = jax.jit(lambda p, t: loss_fn(jax, p, t))

    def next_batch() -> Any:
        return jax.make_array_from_process_local_data(sharded, task.tokens[next(stream)])

    is_writer = jax.process_index() == 0
    meta = {"global_batch": global_batch, "processes": processes}
    first_loss = final_loss = None
    if start >= args.steps:
        console.log(
            f"the checkpoint already has {start} steps (--steps {args.steps}): nothing "
            "to train; raise --steps to train more"
        )

    def agreed_stop() -> int:  # the signal any process got, known to all
        if processes == 1:
            return stop.signal
        seen = multihost_utils.process_allgather(np.array([stop.signal], np.int32))
        return int(np.asarray(seen).max())

    def save(step: int) -> str:
        if not is_writer:
            return str(directory / f"step{step}.npz")
        path = str(save_checkpoint(jax, directory, step, params, state, meta))
        console.log(f"checkpoint step {step} saved to {path}")
        return path

    stopped_by = 0
    done = start
    console.progress(total=args.steps, initial=min(start, args.steps))
    for step in range(start + 1, args.steps + 1):
        if stopped_by := agreed_stop():
            break
        harness.maybe_fail(args, jax.process_index(), step)
        params, state, loss = train_step(params, state, next_batch())
        step_hook.step()  # no torch optimizer here: the entrypoint learns of the step this way
        console.advance()
        last = step == args.steps
        if step == start + 1 or last or step % args.log_every == 0:
            final_loss = float(loss)  # the mean over the global batch, the same on every process
            first_loss = final_loss if first_loss is None else first_loss
            console.log(f"step {step}/{args.steps} loss {final_loss:.4f}", meter=True)
        if last or step % args.save_every == 0:
            checkpoint = save(step)
        done = step
    console.close()
    if stopped_by:
        console.log(
            f"{harness.StopRequest.name(stopped_by)}: stopping after step {done} of {args.steps}"
        )
        if done > start and not (checkpoint or "").endswith(f"step{done}.npz"):
            checkpoint = save(done)
    if first_loss is None:
        first_loss = final_loss = float(eval_loss(params, next_batch()))

    results = harness.Results(
        job="jax",
        rank=jax.process_index(),
        world_size=jax.process_count(),
        local_rank=0,
        node_rank=place.node_rank,
        node=place.node,
        backend=f"jax-{backend}",
        device=device,
        devices=len(devices),
        steps=max(start, done),
        trained_steps=max(0, done - start),
        resumed_from=resumed_from,
        first_loss=first_loss,
        final_loss=final_loss,
        loss_floor=task.floor,
        global_batch=global_batch,
        checkpoint_writer=is_writer,
        checkpoint=checkpoint,
        seconds=round(time.monotonic() - started, 2),
        stopped_by=harness.StopRequest.name(stopped_by) if stopped_by else None,
    )
    results.write(args.results)
    multihost_utils.sync_global_devices("entrypoint-job-done")
    if stopped_by:
        return 128 + stopped_by
    console.log(
        f"done: loss {first_loss:.4f} -> {final_loss:.4f} (floor {task.floor:.3f}) in "
        f"{results.trained_steps} steps, {results.seconds:.1f} s; results in {args.results}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
