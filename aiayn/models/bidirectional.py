"""Asynchronous bidirectional decoding (Zhang et al. 2018, "Asynchronous Bidirectional Decoding for
Neural Machine Translation"): the encoder–decoder with a second, right-to-left decoder.

The right-to-left decoder reads ``[bos] + reversed target`` over the same encoder memory; every layer
of the left-to-right decoder has the fourth sublayer of the first tutorial's decoder layer, attending
to the right-to-left decoder's final states (the "right-to-left memory") under their padding mask.
Both decoders share the target embedding and the output projection. Which sequence the memory is made
from (the reversed reference, the right-to-left decoder's own translation) is the caller's choice:
training and decoding each pass theirs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import NamedTuple

import torch
from torch import Tensor

from aiayn.masks import padding_mask
from aiayn.models.config import TransformerConfig
from aiayn.models.transformer import Transformer
from aiayn.modules.kv_cache import DecoderCache
from aiayn.modules.layers import DecoderContext


class BidirectionalOutput(NamedTuple):
    """The two decoders' outputs (states or logits) for one batch.

    Shape:
        l2r: (B, T, ·) for ``tgt``; r2l: (B, T', ·) for ``r2l_tgt``
    """

    l2r: Tensor
    r2l: Tensor


class R2LMemory(NamedTuple):
    """What the left-to-right decoder reads as its right-to-left memory in ``hidden``."""

    tgt: Tensor | None = None  # (B, T'') bos + the sequence whose states are the memory; None: r2l_tgt
    keep: Tensor | None = None  # (B,) bool; False: the row reads bos's state only (memory dropout)
    detach: bool = False  # no gradient from the left-to-right decoder into the memory
    frozen: bool = False  # the right-to-left pass runs without gradient (a frozen right-to-left decoder)


class BidirectionalTransformer(Transformer):
    """``Transformer`` + a right-to-left decoder whose states are the left-to-right decoder's second
    memory.

    Shape:
        src: (B, S), tgt: (B, T) (bos + target), r2l_tgt: (B, T') (bos + reversed target)
        returns: ``BidirectionalOutput`` of logits (B, T, V) and (B, T', V)
    """

    def __init__(self, config: TransformerConfig):
        if not config.bidirectional:
            raise ValueError("a BidirectionalTransformer needs TransformerConfig(bidirectional=True)")
        super().__init__(config)

    def decode_r2l(
        self,
        tgt: Tensor,
        context: DecoderContext,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, list[dict]]:
        """The right-to-left decoder's states for ``tgt`` = ``[bos] + reversed target`` (as ``decode``;
        it reads ``context.memory`` only).

        Shape: tgt (B, T'), context.memory (B, S, d_model) -> (B, T', d_model)
        """
        return self._decode(self.r2l_decoder, tgt, context, None, cache, need_weights)

    def r2l_mask(self, r2l_tgt: Tensor) -> Tensor:
        """(B, 1, 1, T'): the right-to-left decoder's states that are not padding."""
        return padding_mask(r2l_tgt, self.config.pad_id)

    def with_r2l_memory(self, context: DecoderContext, r2l_tgt: Tensor, states: Tensor | None = None):
        """``context`` with the right-to-left memory of ``r2l_tgt``: its teacher-forced states (or the
        given ``states`` of it) under its padding mask."""
        states = self.decode_r2l(r2l_tgt, context) if states is None else states  # (B, T', d_model)
        return dataclasses.replace(context, r2l_memory=states, r2l_mask=self.r2l_mask(r2l_tgt))

    def hidden(
        self, src: Tensor, tgt: Tensor, r2l_tgt: Tensor, memory: R2LMemory | None = None
    ) -> BidirectionalOutput:
        """Both decoders' final states. The left-to-right decoder reads the states of ``memory.tgt``
        (bos + another right-to-left sequence: a cached translation, the right-to-left decoder's own
        greedy one, as in decoding) or, without it, those of ``r2l_tgt`` itself (one pass for both:
        teacher-forced on the reversed reference in Zhang et al., on a cached translation in Su et al.).

        Shape: src (B, S), tgt (B, T), r2l_tgt (B, T') -> (B, T, d_model), (B, T', d_model)
        """
        memory = memory or R2LMemory()
        context = self.context(src)
        with torch.no_grad() if memory.frozen else contextlib.nullcontext():
            r2l_states = self.decode_r2l(r2l_tgt, context)  # (B, T', d_model)
        memory_tgt = r2l_tgt if memory.tgt is None else memory.tgt
        if memory.tgt is None:
            states = r2l_states
        else:
            with torch.no_grad() if memory.detach or memory.frozen else contextlib.nullcontext():
                states = self.decode_r2l(memory_tgt, context)  # (B, T'', d_model)
        states = states.detach() if memory.detach else states
        r2l_context = self.with_r2l_memory(context, memory_tgt, states)
        if memory.keep is not None:  # memory dropout: a dropped row sees bos's state only
            first = torch.arange(memory_tgt.size(1), device=src.device) == 0  # (T'',)
            keep = r2l_context.r2l_mask & (memory.keep.view(-1, 1, 1, 1) | first)  # (B, 1, 1, T'')
            r2l_context = dataclasses.replace(r2l_context, r2l_mask=keep)
        l2r = self.decode(tgt, r2l_context)  # (B, T, d_model)
        return BidirectionalOutput(l2r, r2l_states)

    def forward(
        self, src: Tensor, tgt: Tensor, r2l_tgt: Tensor, memory: R2LMemory | None = None
    ) -> BidirectionalOutput:
        """Both decoders' logits (``hidden``, then the shared output projection)."""
        l2r, r2l = self.hidden(src, tgt, r2l_tgt, memory)
        return BidirectionalOutput(self.head(l2r), self.head(r2l))

    def attention_weights(self, src: Tensor, tgt: Tensor, r2l_tgt: Tensor) -> dict[str, list[Tensor]]:
        """``Transformer.attention_weights`` plus the right-to-left decoder's ``"r2l_self"`` and
        ``"r2l_cross"`` and the left-to-right decoder's ``"cross_r2l"``, with ``r2l_tgt`` as memory."""
        context, enc_w = self._context_with_weights(src)
        states, r2l_w = self.decode_r2l(r2l_tgt, context, need_weights=True)
        out = {
            "encoder": enc_w,
            "r2l_self": [w["self"] for w in r2l_w],
            "r2l_cross": [w["cross"] for w in r2l_w],
        }
        return {**out, **self._decoder_weights(tgt, self.with_r2l_memory(context, r2l_tgt, states))}


def build_transformer(config: TransformerConfig | None = None) -> Transformer:
    """The encoder–decoder ``config`` describes: a ``BidirectionalTransformer`` when
    ``config.bidirectional``, else a ``Transformer``."""
    if config is not None and config.bidirectional:
        return BidirectionalTransformer(config)
    return Transformer(config)
