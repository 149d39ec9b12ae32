"""Asynchronous bidirectional decoding (Zhang et al. 2018): right to left first, then left to right.

``BidirectionalAdapter.start`` encodes the source once, runs a whole search with the right-to-left
decoder (``memory_search``: beam ``r2l_beam``, the training cache's search and length limit), feeds
``[bos] + its best hypothesis`` (eos dropped) back through that decoder in one teacher-forced pass
(exactly as training computes the states the left-to-right decoder learnt to read), and hands those
states, with their padding mask, to the left-to-right search as ``r2l_memory``. The fourth
sublayer's keys and values are projected from them once per sentence (a static ``"cross_r2l"``
cache) and reused at every step and by every beam. Any search strategy (greedy, beam, sampling) then
runs over this adapter as over a plain one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.data.batching import pad_rows
from aiayn.decoding.adapters import R2LAdapter, Seq2SeqAdapter
from aiayn.decoding.ensemble import EnsembleAdapter
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.scoring import Hypothesis
from aiayn.decoding.search import search
from aiayn.models.bidirectional import BidirectionalTransformer
from aiayn.models.ensemble import Ensemble
from aiayn.models.transformer import Transformer
from aiayn.modules.layers import DecoderContext

# a right-to-left memory's tokens beyond its source's (eos not counted): a weak model's runaway
# repetitions would otherwise fill it with max_len_b tokens more, each padding its whole batch
R2L_MARGIN = 10


def memory_search(beam: int, use_cache: bool = True) -> SearchConfig:
    """The search that writes a right-to-left memory: the training cache's (``pseudo_targets``) and
    decoding's alike, whatever the left-to-right search does (sampling, its length penalty, min_len)."""
    return SearchConfig(beam=beam, max_len_b=R2L_MARGIN, use_cache=use_cache)


def memory_limits(src: Tensor, pad_id: int, limit: int | Tensor | None = None) -> Tensor:
    """Each source's limit on its memory's tokens: ``memory_search``'s (its length without eos +
    ``R2L_MARGIN``), within ``limit`` (the left-to-right search's) when given.

    Shape: src (B, S) right-padded ids + eos -> (B,)
    """
    own = (src != pad_id).sum(1) - 1 + R2L_MARGIN
    return own if limit is None else torch.minimum(own, torch.as_tensor(limit, device=src.device))


def r2l_inputs(hyps: list[list[Hypothesis]], bos_id: int, eos_id: int, pad_id: int, device) -> Tensor:
    """``[bos] + tokens`` of each input's best right-to-left hypothesis (eos dropped), right-padded.

    Shape:
        -> (B, 1 + longest hypothesis)
    """
    return pad_rows([[t for t in h[0].tokens if t != eos_id] for h in hyps], pad_id, first=bos_id).to(device)


def r2l_translation(
    model: BidirectionalTransformer,
    src: Tensor,
    context: DecoderContext,
    config: SearchConfig,
    max_len: int | Tensor,
    use_cache: bool = True,
) -> tuple[list[list[Hypothesis]], Tensor]:
    """The right-to-left decoder's own translation of ``src`` (whose encoder memory ``context`` holds):
    its hypotheses (best first) and ``[bos] + the best one`` (``r2l_inputs``), the sequence whose
    teacher-forced states become the left-to-right decoder's memory. Decoding uses it; so does
    training with ``r2l_memory_from="greedy"``, so that both read the same kind of memory.

    Shape:
        src (B, S), context.memory (B, S, d_model) -> B lists of hypotheses, (B, 1 + longest hypothesis)
    """
    c = model.config
    if c.positional == "learned":  # [bos] + a hypothesis cut at the limit (no eos) must fit the positions
        room = c.max_len - 1
        max_len = max_len.clamp(max=room) if isinstance(max_len, Tensor) else min(max_len, room)
    backward = _Started(R2LAdapter(model, use_cache), context)
    hyps = search(backward, src, config, max_len)
    return hyps, r2l_inputs(hyps, c.bos_id, c.eos_id, c.pad_id, src.device)


class BidirectionalAdapter(Seq2SeqAdapter):
    """The left-to-right decoder of a bidirectional ``Transformer``, attending to the states of the
    right-to-left decoder's own translation.

    Shape:
        start: src (B, S) -> first tokens (B·n, 1); ``r2l_hypotheses``: B lists, best first
    """

    def __init__(self, model: BidirectionalTransformer, config: SearchConfig, max_len: int | Tensor):
        super().__init__(model, config.use_cache)
        self.r2l_config = memory_search(config.r2l_beam or config.beam, config.use_cache)
        self.max_len = max_len
        self.r2l_hypotheses: list[list[Hypothesis]] = []

    def start(self, src: Tensor, n: int = 1) -> Tensor:
        m = self.model
        context = m.context(src)  # the encoder memory, shared by both passes
        limits = memory_limits(src, m.config.pad_id, self.max_len)  # the cache's, within the search's
        self.r2l_hypotheses, r2l_in = r2l_translation(
            m, src, context, self.r2l_config, limits, self.use_cache
        )
        # the states of r2l_in, teacher-forced as in training, under their padding mask (B, 1, 1, T')
        return self.start_from(m.with_r2l_memory(context, r2l_in), n)


class _Started:
    """An adapter whose ``start`` reuses a decoder context already computed (the search calls
    ``start(inputs, n)``; everything else passes through)."""

    def __init__(self, adapter: Seq2SeqAdapter, context: DecoderContext):
        self.adapter, self.context = adapter, context

    def start(self, src: Tensor, n: int = 1) -> Tensor:
        return self.adapter.start_from(self.context, n)

    def __getattr__(self, name: str):
        return getattr(self.adapter, name)


def adapter_for_translation(
    model: Transformer | Ensemble, config: SearchConfig, max_len: int | Tensor
) -> Seq2SeqAdapter | EnsembleAdapter:
    """The adapter a translation model needs: two passes for a bidirectional one; for an ensemble,
    one that moves its members' own adapters (these, member by member) in step."""
    if isinstance(model, Ensemble):
        return EnsembleAdapter(model, [adapter_for_translation(m, config, max_len) for m in model.members])
    if model.config.bidirectional:
        return BidirectionalAdapter(model, config, max_len)
    return Seq2SeqAdapter(model, config.use_cache)
