"""A search that sentences join and leave between decoding steps (iteration-level batching).

A server that decodes one batch at a time makes a request that arrives during a search wait for the
whole search. ``RunningSearch`` instead keeps one batch of sentences (``beam.Beams``) going: ``add``
encodes new sentences, projects their memory's cross-attention keys and values into a cache (the
prefill, no decoder step) and merges their rows into the running batch; ``step`` advances every
sentence by one token — the new ones take their first — and returns each sentence that is done at
once. A sentence decodes exactly as it would alone (tests): its positions, key mask, length limit
and length penalty are its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from aiayn.decoding.adapters import Seq2SeqAdapter
from aiayn.decoding.beam import Beams
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.scoring import Hypothesis
from aiayn.models.transformer import Transformer

Done = list[tuple[Hashable, list[Hypothesis]]]


class RunningSearch:
    """Beam search (greedy when ``config.beam`` is 1) of a plain encoder–decoder ``model`` over
    sentences that arrive while it runs. ``len()`` is the number of sentences in it."""

    def __init__(self, model: Transformer, config: SearchConfig):
        plain = isinstance(model, Transformer) and not model.config.bidirectional  # not an Ensemble
        if config.sample or config.mbr or config.r2l_beam is not None or not plain:
            raise ValueError("a running search decodes a plain model with beam search or greedy only")
        self.model, self.config = model, config
        self.beams: Beams | None = None

    def __len__(self) -> int:
        return 0 if self.beams is None else len(self.beams)

    @property
    def rows(self) -> int:
        """Decoder rows in flight (sentences × beam)."""
        return len(self) * self.config.beam

    @torch.inference_mode()
    def add(self, src: Tensor, max_len: Tensor | int, tags: Sequence[Hashable]) -> None:
        """Start decoding ``src`` (B, S), one tag per row: encode it, project its memory's keys and
        values into a cache of its own (``prime``) and merge its rows into the running batch; its
        first token comes with the next ``step``, computed with everyone else's."""
        new = Beams(Seq2SeqAdapter(self.model), src, max_len, self.config, list(tags))
        new.decoder.prime()
        if not len(self):
            self.beams = new
        else:
            self.beams.join(new)

    @torch.inference_mode()
    def step(self) -> Done:
        """One token more for every sentence; the sentences that are done, with their hypotheses."""
        return self.beams.step() if len(self) else []

    @torch.inference_mode()
    def drop(self, tags: set[Hashable]) -> None:
        """Stop decoding the sentences ``tags`` (their callers have gone)."""
        if len(self):
            self.beams.drop(tags)
