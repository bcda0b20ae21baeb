"""A Hugging Face Trainer script in the shape of transformers' examples (run_translation.py,
run_clm.py): TrainingArguments from the command line, `--deepspeed ds_config.json` and all,
then Trainer(...).train(). Nothing in it knows about the entrypoint.

The model is a tiny GPT-2 built from a config here (never downloaded) and the data random
token ids, so it runs offline on CPU in seconds:

    entrypoint run -- python hf_trainer.py --deepspeed ds_config_zero2.json \
        --output_dir /tmp/out --max_steps 4 --per_device_train_batch_size 2

Every rank prints `hf_trainer: rank R of W trained ...`; rank 0 then prints
`hf_trainer: done, loss L`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint


@dataclass
class ModelArguments:
    n_layer: int = field(default=2, metadata={"help": "transformer blocks of the tiny GPT-2"})
    n_embd: int = field(default=64, metadata={"help": "hidden size"})
    vocab_size: int = field(default=256, metadata={"help": "token ids drawn from 0..vocab-1"})
    seq_len: int = field(default=32, metadata={"help": "tokens per example"})
    examples: int = field(default=256, metadata={"help": "examples in the random data set"})


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, count: int, seq_len: int, vocab: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (count, seq_len), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    model_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)
    config = GPT2Config(
        n_layer=model_args.n_layer,
        n_embd=model_args.n_embd,
        n_head=2,
        vocab_size=model_args.vocab_size,
        n_positions=model_args.seq_len,
    )
    model = GPT2LMHeadModel(config)
    data = RandomTokens(
        model_args.examples, model_args.seq_len, model_args.vocab_size, training_args.seed
    )
    # Detecting the last checkpoint, as run_clm.py does: a job started again resumes from it.
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir):
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
        if last_checkpoint is not None and training_args.resume_from_checkpoint is None:
            print(f"hf_trainer: resuming from {last_checkpoint}", flush=True)
    trainer = Trainer(model=model, args=training_args, train_dataset=data)
    result = trainer.train(
        resume_from_checkpoint=training_args.resume_from_checkpoint or last_checkpoint
    )
    loss = result.training_loss
    rank = training_args.process_index
    world = training_args.world_size
    engine = type(trainer.model_wrapped).__name__
    inner = trainer.optimizer  # accelerate's wrapper, DeepSpeed's ZeRO optimizer, the optimizer
    while hasattr(inner, "optimizer") and inner.optimizer is not inner:
        inner = inner.optimizer
    optimizer = type(inner).__name__
    print(
        f"hf_trainer: rank {rank} of {world} trained {result.global_step} steps with {engine} "
        f"and {optimizer} (local rank {os.environ.get('LOCAL_RANK')}, device "
        f"{training_args.device})",
        flush=True,
    )
    if rank == 0:
        assert math.isfinite(loss), loss
        print(f"hf_trainer: done, loss {loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
