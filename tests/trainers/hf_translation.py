"""A Hugging Face `Seq2SeqTrainer` in the shape of transformers' examples/pytorch/translation/
run_translation.py (what seed 003 runs with `--deepspeed ds_config.json`): `HfArgumentParser`
over model, data and `Seq2SeqTrainingArguments`, `trainer.train()`, `log_metrics`,
`save_model`. The model is trained from scratch as the examples' `--model_type` and
`--config_overrides` do (run_clm.py), a tiny BART, so nothing is downloaded; the data is a
synthetic translation (the source sequence reversed) in place of wmt16. Written as a user
writes it: nothing from this project.

Run:  entrypoint run -- python hf_translation.py --deepspeed ds_config_zero2.json \
          --output_dir /tmp/out --do_train --per_device_train_batch_size 4 \
          --max_train_samples 256 --num_train_epochs 1 --report_to none
"""

import logging
from dataclasses import dataclass, field

import torch
from transformers import (
    CONFIG_MAPPING,
    AutoModelForSeq2SeqLM,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    default_data_collator,
    set_seed,
)

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_type: str = field(default="bart", metadata={"help": "Train this model type from scratch"})
    config_overrides: str = field(
        default="vocab_size=64,d_model=32,encoder_layers=2,decoder_layers=2,"
                "encoder_attention_heads=4,decoder_attention_heads=4,encoder_ffn_dim=64,"
                "decoder_ffn_dim=64,max_position_embeddings=64",
        metadata={"help": "Override some existing default config settings: n_embd=10,..."})


@dataclass
class DataTrainingArguments:
    max_train_samples: int = field(default=256, metadata={"help": "Training examples"})
    max_source_length: int = field(default=12, metadata={"help": "Tokens per sequence"})


class ReversedSequences(torch.utils.data.Dataset):
    """Source: random tokens above the special ones; target: the same, reversed, then </s>."""

    def __init__(self, samples, length, vocab, eos, seed):
        generator = torch.Generator().manual_seed(seed)
        self.source = torch.randint(4, vocab, (samples, length), generator=generator)
        self.eos = torch.tensor([eos])

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        source = self.source[i]
        labels = torch.cat([source.flip(0), self.eos])
        return {"input_ids": source, "attention_mask": torch.ones_like(source), "labels": labels}


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        level=logging.INFO if training_args.should_log else logging.WARN)
    set_seed(training_args.seed)

    config = CONFIG_MAPPING[model_args.model_type]()
    config.update_from_string(model_args.config_overrides)
    model = AutoModelForSeq2SeqLM.from_config(config)
    logger.info(f"Training new model from scratch: {sum(p.numel() for p in model.parameters())} "
                "parameters")

    train_dataset = ReversedSequences(data_args.max_train_samples, data_args.max_source_length,
                                      config.vocab_size, config.eos_token_id, training_args.seed)
    trainer = Seq2SeqTrainer(model=model, args=training_args, train_dataset=train_dataset,
                             data_collator=default_data_collator)

    train_result = trainer.train()
    trainer.save_model()
    metrics = train_result.metrics
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    print(f"hf trainer: process {training_args.process_index} of {training_args.world_size} "
          f"trained {trainer.state.global_step} steps, train_loss {metrics['train_loss']:.4f}",
          flush=True)


if __name__ == "__main__":
    main()
