"""The built-in DeepSpeed job: a tiny transformer LM trained with ZeRO stage 2.

Started by torchrun (one worker per GPU, or per CPU worker), it reads RANK, LOCAL_RANK and
WORLD_SIZE from torchrun, the DeepSpeed config from ENTRYPOINT_DEEPSPEED_CONFIG (accumulation
already derived for this world size) and the device from the entrypoint's plan. Checkpoints are
DeepSpeed's collective save: one tag directory per save under <output>/checkpoints, in which
global rank 0 writes the model weights and `latest`, and every worker its ZeRO optimizer shard.
ENTRYPOINT_JOB_VERBOSE=1 keeps DeepSpeed's own info logs.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from entrypoint.job import harness
from entrypoint.job.data import batches, make_task

if TYPE_CHECKING:
    import torch

DESCRIPTION = (
    "The image's built-in DeepSpeed ZeRO-2 job: a tiny transformer language model on a "
    "synthetic Markov-chain language. Run it through `entrypoint run` (or torchrun)."
)
MODEL_FILE = "mp_rank_00_model_states.pt"
META_FILE = "job.json"
WEIGHTS_ONLY = "weights only: "


def build_model(
    vocab: int, seq_len: int, d_model: int = 64, layers: int = 2, heads: int = 4
) -> torch.nn.Module:
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
            self.mlp = nn.Sequential(
                nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
            )

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            b, t, _ = h.shape
            q, k, v = (
                x.view(b, t, heads, -1).transpose(1, 2)
                for x in self.qkv(self.norm1(h)).chunk(3, dim=-1)
            )
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + self.proj(attended.transpose(1, 2).reshape(b, t, d_model))
            return h + self.mlp(self.norm2(h))

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.position = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)

        def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            h = self.embed(tokens) + self.position[: tokens.shape[1]]
            for block in self.blocks:
                h = block(h)
            logits = self.head(self.norm(h)).float()
            return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1).long())

    return TinyLM()


def choose_device(plan: dict) -> tuple[str, str]:
    """(device, backend): cuda + nccl when the plan says cuda and torch sees a GPU, else cpu +
    gloo."""
    import torch

    wanted = plan.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    if wanted == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(
                "[job] ERROR: the plan says device cuda but torch sees no GPU "
                f"(torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')}). Start the container "
                "with --gpus all, or set ENTRYPOINT_DEVICE=cpu"
            )
        return "cuda", "nccl"
    return "cpu", "gloo"


def find_checkpoint(directory: Path, world_size: int) -> tuple[int, str, str]:
    """(step or -1, tag, why): the checkpoint `latest` names, if this worker can read all of it.
    One written by another number of workers (a spare took over with other GPUs, the job shrank
    or grew back) resumes its weights and step; the optimizer's state starts afresh, as ZeRO's
    shards do not carry over (`why` starts with WEIGHTS_ONLY)."""
    latest = directory / "latest"
    if not latest.is_file():
        return -1, "", f"no checkpoint in {directory}"
    tag = latest.read_text().strip()
    folder = directory / tag
    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError):
        return -1, tag, f"{folder / META_FILE} is missing or unreadable"
    if meta.get("world_size") != world_size and (folder / MODEL_FILE).is_file():
        return (
            int(meta["step"]),
            tag,
            f"{WEIGHTS_ONLY}{tag} was written by {meta.get('world_size')} workers, this job has "
            f"{world_size}: the model's weights resume, Adam's state starts afresh (ZeRO shards "
            "do not carry over)",
        )
    shards = list(folder.glob("*zero_pp_rank_*_optim_states.pt"))
    if not (folder / MODEL_FILE).is_file() or len(shards) != world_size:
        return (
            -1,
            tag,
            (
                f"{folder} lacks files here ({len(shards)} of {world_size} shards): "
                "is the output directory shared by every node?"
            ),
        )
    return int(meta["step"]), tag, f"{folder}"


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = harness.parse_args(argv, "python -m entrypoint.job", DESCRIPTION)
    place = harness.Place.from_env()
    console = harness.Console(place.rank)
    plan = harness.read_plan()
    device, backend = choose_device(plan)
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")

    import deepspeed
    import torch
    from deepspeed.utils import logger as ds_logger

    if not os.environ.get("ENTRYPOINT_JOB_VERBOSE"):
        ds_logger.setLevel(logging.WARNING)
        # DeepSpeed's own use of a torch API that torch now deprecates: not the user's concern.
        warnings.filterwarnings(
            "ignore", message=".*all_gather_into_tensor.*", category=FutureWarning
        )
    if device == "cuda":
        torch.cuda.set_device(place.local_rank)
    torch.manual_seed(args.seed)
    stop = harness.StopRequest()
    timeout = datetime.timedelta(seconds=int(os.environ.get("ENTRYPOINT_COLLECTIVE_TIMEOUT", 600)))
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
    import torch.distributed as dist

    world = dist.get_world_size()

    def barrier() -> None:  # naming the GPU spares nccl's guess (and its warning)
        dist.barrier(device_ids=[place.local_rank] if device == "cuda" else None)

    config, config_from = harness.deepspeed_config(world, device)
    task = make_task(args.seed)
    model = build_model(task.vocab, task.seq_len)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    micro, accumulation = (
        engine.train_micro_batch_size_per_gpu(),
        engine.gradient_accumulation_steps(),
    )
    global_batch = micro * accumulation * world
    console.log(
        f"{world} workers on {plan.get('nnodes', '?')} nodes, device {device}, backend "
        f"{backend}, ZeRO stage {engine.zero_optimization_stage()}; global batch "
        f"{global_batch} = micro {micro} x accumulation {accumulation} x {world} workers "
        f"(config {config_from})"
    )
    params = sum(p.numel() for p in model.parameters())
    console.log(
        f"model: tiny transformer LM, {params:,} parameters; data: {len(task.tokens)} "
        f"synthetic sequences of {task.seq_len} tokens, vocabulary {task.vocab}, loss "
        f"floor {task.floor:.3f} (guessing: {math.log(task.vocab):.3f})"
    )

    # Resume only when every worker sees the same complete checkpoint.
    start, resumed_from, checkpoint = 0, None, None
    step_seen, tag, why = (
        find_checkpoint(args.checkpoints, world)
        if args.resume == "auto"
        else (-1, "", "--resume never")
    )
    seen = torch.tensor(
        [step_seen, -step_seen], dtype=torch.long, device=engine.device
    )  # nccl: on GPU
    dist.all_reduce(seen, op=dist.ReduceOp.MIN)
    if step_seen >= 0 and seen[0] == step_seen and -seen[1] == step_seen:
        weights_only = why.startswith(WEIGHTS_ONLY)
        if weights_only:
            console.warn(why.removeprefix(WEIGHTS_ONLY))
        load_path, client = engine.load_checkpoint(
            str(args.checkpoints), tag, load_module_only=weights_only
        )
        if load_path is None:
            raise SystemExit(f"[job] ERROR: DeepSpeed could not load {args.checkpoints / tag}")
        start = resumed_from = int(client["step"])
        checkpoint = str(args.checkpoints / tag)
        console.log(f"resuming from checkpoint {checkpoint} (step {start})")
    else:
        if step_seen >= 0:
            why = (
                f"not every worker can read {args.checkpoints / tag} (is the output directory "
                "shared by every node?)"
            )
        console.log(f"starting fresh: {why}")
        if place.local_rank == 0 and (
            moved := harness.move_aside(args.checkpoints, place.node_rank)
        ):
            console.warn(f"moved the old checkpoints aside to {moved}")
        barrier()

    if place.local_rank == 0:
        harness.drop_stale_results(args.results, world)
    is_writer = engine.global_rank == 0
    if start >= args.steps:
        console.log(
            f"the checkpoint already has {start} steps (--steps {args.steps}): nothing to "
            "train; raise --steps to train more"
        )
    console.progress(total=args.steps, initial=min(start, args.steps))
    stream = batches(len(task.tokens), place.rank, world, micro, args.seed, start * accumulation)
    tokens = torch.from_numpy(task.tokens)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        rows = tokens[next(stream)].to(engine.device)
        return rows[:, :-1], rows[:, 1:]

    def global_mean(value: float) -> float:
        total = torch.tensor([value], dtype=torch.float64, device=engine.device)
        dist.all_reduce(total)
        return total.item() / world

    def save(step: int) -> str:
        folder = args.checkpoints / f"step{step}"
        if is_writer:  # written before DeepSpeed's `latest`, so a `latest` always has it
            folder.mkdir(parents=True, exist_ok=True)
            (folder / META_FILE).write_text(
                json.dumps({"step": step, "world_size": world, "global_batch": global_batch}) + "\n"
            )
        engine.save_checkpoint(
            str(args.checkpoints), tag=f"step{step}", client_state={"step": step}
        )
        console.log(f"checkpoint step {step} saved to {folder}")
        return str(folder)

    def agreed_stop() -> int:  # the signal any worker got, known to all
        flag = torch.tensor([stop.signal], dtype=torch.long, device=engine.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    first_loss = final_loss = None
    stopped_by = 0
    done = start
    engine.train()
    for step in range(start + 1, args.steps + 1):
        if stopped_by := agreed_stop():
            break
        harness.maybe_fail(args, place.rank, step)
        total = 0.0
        for _ in range(accumulation):
            loss = engine(*next_batch())
            engine.backward(loss)
            engine.step()
            total += loss.item()
        local = total / accumulation
        console.advance(local)
        last = step == args.steps
        if step == start + 1 or last or step % args.log_every == 0:
            mean = global_mean(local)
            first_loss = mean if first_loss is None else first_loss
            final_loss = mean
            console.log(f"step {step}/{args.steps} loss {mean:.4f}", meter=True)
        if last or step % args.save_every == 0:
            checkpoint = save(step)
        done = step
    console.close()
    if stopped_by:
        name = harness.StopRequest.name(stopped_by)
        console.log(f"{name}: stopping after step {done} of {args.steps}")
        if done > start and not (checkpoint or "").endswith(f"step{done}"):
            checkpoint = save(done)

    if first_loss is None:  # nothing trained: report the loss the checkpoint reaches
        engine.eval()
        with torch.no_grad():
            first_loss = final_loss = global_mean(engine(*next_batch()).item())

    results = harness.Results(
        job="deepspeed",
        rank=place.rank,
        world_size=world,
        local_rank=place.local_rank,
        node_rank=place.node_rank,
        node=place.node,
        backend=backend,
        device=device,
        devices=world,
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
    barrier()
    if stopped_by:
        dist.destroy_process_group()
        return 128 + stopped_by
    console.log(
        f"done: loss {first_loss:.4f} -> {final_loss:.4f} (floor {task.floor:.3f}) in "
        f"{results.trained_steps} steps, {results.seconds:.1f} s; results in {args.results}"
    )
    dist.destroy_process_group()
    return 0
