"""The encoder–decoder Transformer of the paper (Figure 1).

``Transformer(TransformerConfig())`` is the base model: 6+6 post-norm layers, d_model 512, 8 heads,
d_ff 2048, dropout 0.1, sinusoidal positions, source and target embeddings shared with the output
projection. ``encode`` and ``decode`` are separate so that decoding (greedy, beam search) runs the
encoder once and the decoder step by step with a ``DecoderCache``.

``TransformerConfig(bidirectional=True)`` adds asynchronous bidirectional decoding (Zhang et al.
2018, "Asynchronous Bidirectional Decoding for Neural Machine Translation"): a second, right-to-left
decoder reads ``[bos] + reversed target`` over the same encoder memory, and every layer of the
left-to-right decoder gets the fourth sublayer of the first tutorial's decoder layer, attending to
the right-to-left decoder's final states (``r2l_memory``) under their padding mask. Both decoders
share the target embedding and the output projection. The plain model builds none of it.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn

from aiayn.masks import causal_mask, padding_mask
from aiayn.models.common import init_weights, make_embedding, make_head
from aiayn.models.config import TransformerConfig
from aiayn.modules.kv_cache import DecoderCache
from aiayn.modules.layers import Decoder, Encoder


class Transformer(nn.Module):
    """Encoder–decoder: logits = Project(Decoder(Embed(tgt), Encoder(Embed(src)))).

    Shape:
        src: (B, S) ids, tgt: (B, T) ids (the decoder input, starting with bos)
        returns: logits (B, T, tgt_vocab_size)
    """

    def __init__(self, config: TransformerConfig | None = None):
        super().__init__()
        c = self.config = config or TransformerConfig()
        self.src_embed = make_embedding(c, c.src_vocab_size)
        self.tgt_embed = make_embedding(c, c.tgt_vocab_size)
        self.encoder = Encoder(c, c.n_encoder_layers)
        self.decoder = Decoder(c, c.n_decoder_layers, r2l=c.r2l_memory or c.bidirectional)
        self.r2l_decoder = Decoder(c, c.n_decoder_layers) if c.bidirectional else None
        init_weights(self, c.d_model)
        if c.share_embeddings:
            self.tgt_embed.tokens = self.src_embed.tokens
        self.head = make_head(c, c.tgt_vocab_size, self.tgt_embed if c.tie_output else None,
                              c.output_bias, c.output_pieces)  # fmt: skip
        if not c.tie_output:
            init_weights(self.head, c.d_model)

    def src_mask(self, src: Tensor) -> Tensor:
        """(B, 1, 1, S): source keys that are not padding."""
        return padding_mask(src, self.config.pad_id)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Shape: src (B, S) -> memory (B, S, d_model)."""
        src_mask = self.src_mask(src) if src_mask is None else src_mask
        return self.encoder(self.src_embed(src), src_mask)[0]

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        r2l_memory: Tensor | None = None,
        r2l_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, list[dict]]:
        """Decoder states for ``tgt`` (the new positions only, when a cache holds earlier ones).

        ``tgt_mask`` defaults to the look-ahead mask. Right-padded targets need no padding mask:
        a real position never looks ahead to the padding after it.

        Shape: tgt (B, T), memory (B, S, d_model) -> (B, T, d_model)
        """
        return self._decode(self.decoder, tgt, memory, src_mask, tgt_mask, cache, r2l_memory, r2l_mask,
                            need_weights)  # fmt: skip

    def decode_r2l(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, list[dict]]:
        """The right-to-left decoder's states for ``tgt`` = ``[bos] + reversed target`` (as ``decode``).

        Shape: tgt (B, T'), memory (B, S, d_model) -> (B, T', d_model)
        """
        if self.r2l_decoder is None:
            raise ValueError("this model has no right-to-left decoder: build it with bidirectional=True")
        return self._decode(self.r2l_decoder, tgt, memory, src_mask, None, cache, None, None, need_weights)

    def r2l_mask(self, r2l_tgt: Tensor) -> Tensor:
        """(B, 1, 1, T'): the right-to-left decoder's states that are not padding."""
        return padding_mask(r2l_tgt, self.config.pad_id)

    def _decode(self, decoder, tgt, memory, src_mask, tgt_mask, cache, r2l_memory, r2l_mask, need_weights):
        start = 0 if cache is None else len(cache)
        x = self.tgt_embed(tgt, start)
        if tgt_mask is None and not (cache is not None and tgt.size(1) == 1):
            tgt_mask = causal_mask(tgt.size(1), start + tgt.size(1), tgt.device)
        h, weights = decoder(x, memory, tgt_mask, src_mask, r2l_memory, r2l_mask, need_weights, cache)
        return (h, weights) if need_weights else h

    def new_cache(self) -> DecoderCache:
        return DecoderCache(len(self.decoder.layers))

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        r2l_memory: Tensor | None = None,
        r2l_mask: Tensor | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
        r2l_tgt: Tensor | None = None,
        r2l_targets: Tensor | None = None,
        r2l_weight: float = 1.0,
        detach_r2l: bool = False,
        r2l_memory_tgt: Tensor | None = None,
        r_drop: float = 0.0,
    ) -> Tensor | tuple[Tensor, ...]:
        """Logits for every target position; ``r2l_memory`` (B, S', d_model) is the second memory
        of an ``r2l_memory=True`` decoder.

        With ``targets`` (the decoder input shifted left, padded with pad_id) it returns the
        training loss instead: summed label-smoothed loss, summed NLL and the number of real
        targets, with the output projection and the softmax computed at real target positions only
        and no smoothing mass on padding (``OutputProjection.loss``).

        A bidirectional model also takes the right-to-left decoder's input and targets
        (``r2l_tgt`` = bos + reversed target, ``r2l_targets`` = reversed target + eos;
        ``aiayn.data.batching.reverse_targets``): its teacher-forced states are the left-to-right
        decoder's ``r2l_memory`` (with ``detach_r2l``, no gradient flows back through them), and the
        loss is L_l2r + r2l_weight · L_r2l, returned as (loss, l2r NLL, l2r count, r2l NLL, r2l count).
        ``r2l_memory_tgt`` (bos + another reversed sequence, e.g. the right-to-left decoder's own
        translation) makes the memory that sequence's states instead of the reference's, as decoding
        does: teacher-forced states of the reference let the left-to-right decoder read the answer.

        ``r_drop`` > 0 (with ``targets``, in training) is R-Drop's α: the batch runs twice, through two
        dropout masks, and the loss adds the passes' symmetric KL (``OutputProjection.r_drop_loss``);
        the loss and NLL are per pass, as without it.

        Shape:
            src (B, S), tgt (B, T) -> logits (B, T, V); targets (B, T) -> three (or five) scalars
        """
        if r_drop:
            if targets is None or self.r2l_decoder is not None:
                raise ValueError("r_drop needs targets and a model without a right-to-left decoder")
            src, tgt, targets = src.repeat(2, 1), tgt.repeat(2, 1), targets.repeat(2, 1)  # (2B, ·)
        src_mask = self.src_mask(src)
        memory = self.encode(src, src_mask)
        r2l_states = None
        if self.r2l_decoder is not None:
            if r2l_tgt is None:
                raise ValueError("a bidirectional model needs r2l_tgt: bos + the reversed target")
            r2l_states = self.decode_r2l(r2l_tgt, memory, src_mask)  # (B, T', d_model)
            if r2l_memory_tgt is None:  # teacher-forced on the reference (Zhang et al.)
                r2l_memory, r2l_memory_tgt = r2l_states, r2l_tgt
            else:
                with torch.no_grad() if detach_r2l else contextlib.nullcontext():
                    r2l_memory = self.decode_r2l(r2l_memory_tgt, memory, src_mask)  # (B, T'', d_model)
            r2l_memory = r2l_memory.detach() if detach_r2l else r2l_memory
            r2l_mask = self.r2l_mask(r2l_memory_tgt)
        h = self.decode(tgt, memory, src_mask, r2l_memory=r2l_memory, r2l_mask=r2l_mask)  # (B, T, d_model)
        if targets is None:
            return self.head(h)
        pad = self.config.pad_id
        real = targets != pad  # (B, T)
        if r_drop:  # the first pass's rows come first in h[real]
            h_a, h_b = h[real].chunk(2)  # (N, d_model) each
            return self.head.r_drop_loss(h_a, h_b, targets[real][: len(h_a)], label_smoothing, r_drop,
                                         smoothing_exclude=pad)  # fmt: skip
        loss, nll, n = self.head.loss(h[real], targets[real], label_smoothing, smoothing_exclude=pad)
        if r2l_states is None:
            return loss, nll, n
        if r2l_targets is None:
            raise ValueError("a bidirectional model's loss needs r2l_targets: the reversed target + eos")
        real = r2l_targets != pad
        r2l_loss, r2l_nll, r2l_n = self.head.loss(r2l_states[real], r2l_targets[real], label_smoothing,
                                                  smoothing_exclude=pad)  # fmt: skip
        return loss + r2l_weight * r2l_loss, nll, n, r2l_nll, r2l_n

    def attention_weights(
        self,
        src: Tensor,
        tgt: Tensor,
        r2l_memory: Tensor | None = None,
        r2l_mask: Tensor | None = None,
        r2l_tgt: Tensor | None = None,
    ) -> dict[str, list[Tensor]]:
        """Every layer's attention weights, for plotting.

        Returns ``{"encoder": [L × (B, h, S, S)], "decoder_self": [L × (B, h, T, T)],
        "cross": [L × (B, h, T, S)]}`` (and ``"cross_r2l"`` with a right-to-left memory; a
        bidirectional model takes ``r2l_tgt`` and adds its right-to-left decoder's ``"r2l_self"``
        and ``"r2l_cross"``).
        """
        src_mask = self.src_mask(src)
        memory, enc_w = self.encoder(self.src_embed(src), src_mask, need_weights=True)
        out = {"encoder": enc_w}
        if self.r2l_decoder is not None:
            if r2l_tgt is None:
                raise ValueError("a bidirectional model needs r2l_tgt: bos + the reversed target")
            r2l_memory, r2l_w = self.decode_r2l(r2l_tgt, memory, src_mask, need_weights=True)
            r2l_mask = self.r2l_mask(r2l_tgt)
            out.update(r2l_self=[w["self"] for w in r2l_w], r2l_cross=[w["cross"] for w in r2l_w])
        _, dec_w = self.decode(tgt, memory, src_mask, None, None, r2l_memory, r2l_mask, need_weights=True)
        for key, name in (("self", "decoder_self"), ("cross", "cross"), ("cross_r2l", "cross_r2l")):
            if key in dec_w[0]:
                out[name] = [w[key] for w in dec_w]
        return out
