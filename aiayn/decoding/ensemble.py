"""Decoding with an ``Ensemble``: one adapter per member, their next-token distributions averaged.

Each member keeps its own encoder memory and KV cache; the search sees a single adapter whose
``step`` returns log((1/M) Σ_m p_m), so greedy, beam search, sampling and minimum Bayes risk work
over an ensemble unchanged. Beams reorder and finished inputs leave every member's cache together.
Members of a bidirectional ensemble each run their own right-to-left search in ``start`` (their
memories differ); the right-to-left translation shown with a hypothesis is the first member's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.decoding.adapters import Seq2SeqAdapter
from aiayn.decoding.scoring import Hypothesis
from aiayn.models.ensemble import Ensemble


class EnsembleAdapter:
    """The members' adapters (``Seq2SeqAdapter``s, or ``BidirectionalAdapter``s: one per member, as
    ``bidirectional.adapter_for_translation`` makes them) moved in step.

    Shape:
        start: src (B, S) -> first tokens (B·n, 1); step: prefix (N, t) -> log-probs (N, V)
    """

    def __init__(self, model: Ensemble, adapters: Sequence[Seq2SeqAdapter]):
        self.model = model
        self.adapters = list(adapters)
        c = model.config
        self.bos_id, self.eos_id, self.pad_id = c.bos_id, c.eos_id, c.pad_id
        limits = [a.vocab_limit for a in self.adapters if a.vocab_limit is not None]
        self.vocab_limit = min(limits, default=None)  # ids no member's tokenizer writes (steps.restrict)
        self.log_m = math.log(len(self.adapters))

    def start(self, src: Tensor, n: int = 1) -> Tensor:
        return [a.start(src, n) for a in self.adapters][0]  # every member starts from the same bos rows

    @property
    def r2l_hypotheses(self) -> list[list[Hypothesis]] | None:
        """A bidirectional ensemble's first member's right-to-left translations (None for plain ones)."""
        return getattr(self.adapters[0], "r2l_hypotheses", None)

    def step(self, prefix: Tensor) -> Tensor:
        log_probs = torch.stack([a.step(prefix) for a in self.adapters])  # (M, N, V)
        return log_probs.logsumexp(0) - self.log_m

    def reorder(self, index: Tensor) -> None:
        for a in self.adapters:
            a.reorder(index)

    def select(self, index: Tensor) -> None:
        for a in self.adapters:
            a.select(index)
