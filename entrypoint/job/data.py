"""The synthetic task: next-token prediction on a sparse Markov chain, generated from a seed.

Every token has FANOUT possible successors with fixed probabilities, so a model that learns the
chain gets from ln(VOCAB) (guessing) down to the chain's entropy (the floor). Plain numpy: the
DeepSpeed and JAX jobs share it and see the same sequences.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

VOCAB = 64
FANOUT = 4
SEQ_LEN = 32
SEQUENCES = 4096


@dataclass(frozen=True)
class Task:
    tokens: np.ndarray  # (SEQUENCES, SEQ_LEN + 1) int32: inputs are [:, :-1], targets [:, 1:]
    floor: float  # mean -log p(next | current) over the data: the best loss a model can reach
    vocab: int = VOCAB
    seq_len: int = SEQ_LEN


def make_task(seed: int = 0, sequences: int = SEQUENCES) -> Task:
    rng = np.random.default_rng(seed)
    successors = np.stack([rng.choice(VOCAB, FANOUT, replace=False) for _ in range(VOCAB)])
    probs = rng.dirichlet(np.full(FANOUT, 1.0), size=VOCAB)
    cumulative = np.cumsum(probs, axis=1)
    tokens = np.empty((sequences, SEQ_LEN + 1), dtype=np.int32)
    tokens[:, 0] = rng.integers(0, VOCAB, sequences)
    picks = np.empty((sequences, SEQ_LEN), dtype=np.int64)
    for t in range(SEQ_LEN):
        current = tokens[:, t]
        draw = rng.random(sequences)[:, None]
        picks[:, t] = np.minimum((draw > cumulative[current]).sum(axis=1), FANOUT - 1)
        tokens[:, t + 1] = successors[current, picks[:, t]]
    floor = float(-np.log(probs[tokens[:, :-1], picks]).mean())
    return Task(tokens=tokens, floor=floor)


def shard_indices(n: int, rank: int, world_size: int, epoch: int, seed: int) -> np.ndarray:
    """This rank's indices for one epoch, the way torch's DistributedSampler shards: one
    permutation shared by all ranks (seeded by seed + epoch), padded to a multiple of
    world_size, then every world_size-th index starting at rank. Plain numpy, so that the
    JAX job shards the same way."""
    order = np.random.default_rng(seed + epoch).permutation(n)
    total = -(-n // world_size) * world_size
    order = np.concatenate([order, order[: total - n]])
    return order[rank:total:world_size]


def batches(
    n: int, rank: int, world_size: int, batch: int, seed: int, start: int = 0
) -> Iterator[np.ndarray]:
    """Endless stream of this rank's index batches, starting at batch number `start`
    (so that a resumed job continues where the checkpoint left off)."""
    per_epoch = (-(-n // world_size)) // batch
    position = start
    while True:
        epoch, offset = divmod(position, per_epoch)
        indices = shard_indices(n, rank, world_size, epoch, seed)
        for i in range(offset, per_epoch):
            yield indices[i * batch : (i + 1) * batch]
            position += 1
