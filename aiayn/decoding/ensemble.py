"""Decoding with an ``Ensemble``: one adapter per member, their next-token distributions averaged.

Each member keeps its own encoder memory and KV cache; the search sees a single adapter whose
``step`` returns log((1/M) Σ_m p_m), so greedy, beam search, sampling and minimum Bayes risk work
over an ensemble unchanged. Beams reorder and finished inputs leave every member's cache together.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from aiayn.decoding.adapters import Seq2SeqAdapter
from aiayn.models.ensemble import Ensemble


class EnsembleAdapter:
    """The members' ``Seq2SeqAdapter``s moved in step.

    Shape:
        start: src (B, S) -> first tokens (B·n, 1); step: prefix (N, t) -> log-probs (N, V)
    """

    def __init__(self, model: Ensemble, use_cache: bool = True):
        self.model = model
        self.adapters = [Seq2SeqAdapter(m, use_cache) for m in model.members]
        c = model.config
        self.bos_id, self.eos_id, self.pad_id = c.bos_id, c.eos_id, c.pad_id
        limits = [a.vocab_limit for a in self.adapters if a.vocab_limit is not None]
        self.vocab_limit = min(limits, default=None)  # ids no member's tokenizer writes (steps.restrict)
        self.log_m = math.log(len(self.adapters))

    def start(self, src: Tensor, n: int = 1) -> Tensor:
        return [a.start(src, n) for a in self.adapters][0]  # every member starts from the same bos rows

    def step(self, prefix: Tensor) -> Tensor:
        log_probs = torch.stack([a.step(prefix) for a in self.adapters])  # (M, N, V)
        return log_probs.logsumexp(0) - self.log_m

    def reorder(self, index: Tensor) -> None:
        for a in self.adapters:
            a.reorder(index)

    def select(self, index: Tensor) -> None:
        for a in self.adapters:
            a.select(index)
