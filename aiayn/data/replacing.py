"""ELECTRA's corruption with a fixed generator: replaced-token detection's inputs and labels.

ELECTRA (Clark et al. 2020, §2) replaces some tokens by a generator's samples and trains the encoder
to say, at *every* position, whether its token was replaced; §3.2 compares learned generators with a
unigram one. Here the generator is fixed, so a step costs one encoder pass and no vocabulary
projection: ``"unigram"`` samples the training text's piece frequencies (the §3.2 generator),
``"uniform"`` every ordinary piece alike (random-token substitution, Yamaguchi et al. 2021).

A share ``p`` of the real tokens (or whole words) is chosen exactly as masked-LM chooses them
(``masking.mask_tokens``: same draws, whole words optional, at least one per sequence); each chosen
piece is replaced by a sample. Labels: 1 where the input differs from the original, 0 where it does
not (a sample that draws the original piece counts as original, as in ELECTRA), -1 at ``bos``,
``eos`` and padding, which are never scored.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from aiayn.data.masking import Masking, mask_tokens
from aiayn.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from aiayn.errors import ConfigError

GENERATORS = ("unigram", "uniform")
NOT_SCORED = -1


class DetectionBatch(NamedTuple):
    """Replaced-token detection inputs and labels (``replace_tokens``)."""

    ids: Tensor  # (B, T) bos + tokens (some replaced by a generator's samples) + eos
    labels: Tensor  # (B, T) 1 replaced, 0 original, -1 not scored (bos, eos, padding)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> DetectionBatch:
        return DetectionBatch(*(t.to(device, non_blocking=non_blocking) for t in self))


def piece_distribution(ids: np.ndarray, vocab_size: int, how: str, first_normal: int = 5) -> np.ndarray:
    """The generator's probabilities over the vocabulary (specials, ids below ``first_normal``, get 0).

    Shape: ids (N,) the training stream -> (vocab_size,) summing to 1"""
    if how not in GENERATORS:
        raise ConfigError(f"generator {how!r} is not one of {GENERATORS}")
    if how == "uniform":
        weights = np.ones(vocab_size)
    else:
        weights = np.bincount(np.asarray(ids, np.int64), minlength=vocab_size)[:vocab_size].astype(np.float64)
    weights[:first_normal] = 0
    if weights.sum() == 0:
        raise ConfigError("the training text has no ordinary piece to sample replacements from")
    return weights / weights.sum()


def replace_tokens(
    ids: Tensor,
    p: float,
    probs: np.ndarray,
    rng: np.random.Generator,
    word_starts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Replace a share ``p`` of the tokens (whole words if ``word_starts`` is given) by samples of
    ``probs``.

    Shape:
        ids: (B, T) -> (inputs (B, T), labels (B, T): 1 replaced, 0 original, -1 not scored)
    """
    masking = Masking(p, 0.0, 0.0, whole_word=word_starts is not None)  # which positions, nothing else
    _, targets = mask_tokens(ids, masking, 0, len(probs), rng, word_starts)
    chosen = targets != PAD_ID  # (B, T)
    samples = rng.choice(len(probs), size=int(chosen.sum()), p=probs)  # (N,) the generator's draws
    inputs = ids.clone()
    inputs[chosen] = torch.from_numpy(samples).to(ids.dtype)
    real = (ids != PAD_ID) & (ids != BOS_ID) & (ids != EOS_ID)  # (B, T) scored
    labels = torch.where(real, (inputs != ids).long(), torch.full_like(ids, NOT_SCORED, dtype=torch.long))
    return inputs, labels
