"""BERT's masked-LM corruption (Devlin et al. 2019, §3.1 and Appendix A.1).

Each real token is *chosen* with probability ``p`` (15%); a chosen token is replaced by ``<mask>``
with probability 0.8, by a random token with 0.1, and kept with 0.1; the model must predict the
original token at every chosen position (and only there). With ``whole_word`` a word (a piece
starting with "▁" and the pieces after it) is chosen or not as a whole (Google's whole-word
masking), each of its pieces then replaced independently. A sequence with no chosen token gets one,
so that every sequence teaches something. ``bos``/``eos``/padding are never chosen; random
replacements are drawn from the ordinary pieces (ids from ``first_normal`` on), never a special.

Masks are drawn from the generator the caller passes: the tasks seed it with (seed, rank, epoch, batch),
so each epoch sees new masks (RoBERTa's dynamic masking) and a resumed run the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from aiayn.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from aiayn.errors import ConfigError


@dataclass(frozen=True)
class Masking:
    """What ``mask_tokens`` does; BERT's values by default."""

    p: float = 0.15  # chance that a token (or word) is chosen
    p_mask: float = 0.8  # a chosen token becomes <mask> ...
    p_random: float = 0.1  # ... or a random token (else it stays)
    whole_word: bool = False

    def __post_init__(self) -> None:
        for name in ("p", "p_mask", "p_random"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
                raise ConfigError(f"{name}={value!r} must be a probability in [0, 1]")
        if self.p <= 0:
            raise ConfigError("p=0 chooses no token to predict; use e.g. 0.15")
        if self.p_mask + self.p_random > 1:
            raise ConfigError(f"p_mask + p_random = {self.p_mask + self.p_random} is more than 1")


def mask_tokens(
    ids: Tensor,
    masking: Masking,
    mask_id: int,
    vocab_size: int,
    rng: np.random.Generator,
    word_starts: Tensor | None = None,
    first_normal: int = 5,
) -> tuple[Tensor, Tensor]:
    """Corrupt a batch for masked-LM training.

    ``word_starts`` (vocab_size,) bool says which ids begin a word (needed for ``whole_word``).

    Shape:
        ids: (B, T) -> (inputs (B, T), targets (B, T) with ``PAD_ID`` where nothing is predicted)
    """
    real = (ids != PAD_ID) & (ids != BOS_ID) & (ids != EOS_ID)  # (B, T) what may be chosen
    draw = torch.from_numpy(rng.random(ids.shape))  # (B, T) one uniform per position
    if masking.whole_word:
        if word_starts is None:
            raise ConfigError("whole-word masking needs the tokenizer's word starts")
        starts = word_starts[ids] | ~real  # a special is a word of its own ...
        starts[:, 1:] |= ~real[:, :-1]  # ... and what follows it starts a new one
        word = starts.long().cumsum(1)  # (B, T) the word each position belongs to
        draw = draw.gather(1, _first_of_word(word))  # every piece takes its word's draw
    chosen = real & (draw < masking.p)
    # a sequence with no chosen token: choose its real position with the smallest draw
    empty = ~chosen.any(1) & real.any(1)
    if empty.any():
        pick = torch.where(real, draw, torch.full_like(draw, 2.0)).argmin(1)
        fix = torch.zeros_like(chosen).scatter_(1, pick[:, None], True) & empty[:, None]
        if masking.whole_word:
            fix = fix.any(1, keepdim=True) & (word == word.gather(1, pick[:, None])) & real
        chosen |= fix
    how = torch.from_numpy(rng.random(ids.shape))  # (B, T) which replacement
    to_mask = chosen & (how < masking.p_mask)
    to_random = chosen & (how >= masking.p_mask) & (how < masking.p_mask + masking.p_random)
    random_ids = torch.from_numpy(rng.integers(first_normal, vocab_size, ids.shape))
    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(to_random, random_ids, inputs)
    return inputs, torch.where(chosen, ids, torch.full_like(ids, PAD_ID))


def _first_of_word(word: Tensor) -> Tensor:
    """For each position, the position where its word begins. Shape: (B, T) -> (B, T)"""
    T = word.size(1)
    pos = torch.arange(T).expand_as(word)
    new = torch.ones_like(word, dtype=torch.bool)
    new[:, 1:] = word[:, 1:] != word[:, :-1]
    first = torch.where(new, pos, torch.zeros_like(pos))
    return first.cummax(1).values
