"""The encoder–decoder Transformer of the paper (Figure 1).

``Transformer(TransformerConfig())`` is the base model: 6+6 post-norm layers, d_model 512, 8 heads,
d_ff 2048, dropout 0.1, sinusoidal positions, source and target embeddings shared with the output
projection. ``encode`` and ``decode`` are separate so that decoding (greedy, beam search) runs the
encoder once and the decoder step by step with a ``DecoderCache``; what the decoder reads besides
its input travels as one ``DecoderContext``.

The model computes and nothing more: ``forward`` gives logits, ``hidden`` the decoder's final states
(for the fused output projection + loss, ``OutputProjection.loss``). Losses are the training tasks'
(``aiayn.training.criteria``). ``TransformerConfig(r2l_memory=True)`` gives every decoder layer the
fourth sublayer of the first tutorial's decoder layer over a second memory the caller supplies;
``bidirectional=True`` is ``aiayn.models.bidirectional.BidirectionalTransformer``, which makes that
memory with a right-to-left decoder of its own (``build_transformer`` picks the class).
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.masks import causal_mask, padding_mask
from aiayn.models.common import init_weights, make_embedding, make_head
from aiayn.models.config import TransformerConfig
from aiayn.modules.kv_cache import DecoderCache
from aiayn.modules.layers import Decoder, DecoderContext, Encoder


class Transformer(nn.Module):
    """Encoder–decoder: logits = Project(Decoder(Embed(tgt), Encoder(Embed(src)))).

    Shape:
        src: (B, S) ids, tgt: (B, T) ids (the decoder input, starting with bos)
        returns: logits (B, T, tgt_vocab_size)
    """

    def __init__(self, config: TransformerConfig | None = None):
        super().__init__()
        c = self.config = config or TransformerConfig()
        if c.bidirectional and type(self) is Transformer:
            raise ValueError("TransformerConfig(bidirectional=True) is a BidirectionalTransformer: "
                             "build it with aiayn.models.build_transformer(config)")  # fmt: skip
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

    def context(
        self, src: Tensor, r2l_memory: Tensor | None = None, r2l_mask: Tensor | None = None
    ) -> DecoderContext:
        """What the decoder reads for ``src``: its encoder memory and padding mask, and the second
        memory of an ``r2l_memory=True`` decoder with its mask (None: every position may be read)."""
        src_mask = self.src_mask(src)
        return DecoderContext(self.encode(src, src_mask), src_mask, r2l_memory, r2l_mask)

    def decode(
        self,
        tgt: Tensor,
        context: DecoderContext,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, list[dict]]:
        """Decoder states for ``tgt`` (the new positions only, when a cache holds earlier ones).

        ``tgt_mask`` defaults to the look-ahead mask. Right-padded targets need no padding mask:
        a real position never looks ahead to the padding after it.

        Shape: tgt (B, T), context.memory (B, S, d_model) -> (B, T, d_model)
        """
        return self._decode(self.decoder, tgt, context, tgt_mask, cache, need_weights)

    def _decode(self, decoder, tgt, context, tgt_mask, cache, need_weights):
        if cache is None:
            x = self.tgt_embed(tgt)
            tgt_mask = causal_mask(tgt.size(1), device=tgt.device) if tgt_mask is None else tgt_mask
        else:  # the positions after the cached ones; rows that joined later have their own (kv_cache.py)
            x = self.tgt_embed(tgt, cache.positions())
            tgt_mask = cache.key_mask(tgt.size(1), tgt.device) if tgt_mask is None else tgt_mask
        h, weights = decoder(x, context, tgt_mask, need_weights, cache)
        return (h, weights) if need_weights else h

    def new_cache(self) -> DecoderCache:
        return DecoderCache(len(self.decoder.layers))

    def hidden(
        self, src: Tensor, tgt: Tensor, r2l_memory: Tensor | None = None, r2l_mask: Tensor | None = None
    ) -> Tensor:
        """The decoder's final states for every target position: ``forward`` before the output
        projection, for the fused projection + loss (``OutputProjection.loss``).

        Shape: src (B, S), tgt (B, T) -> (B, T, d_model)
        """
        return self.decode(tgt, self.context(src, r2l_memory, r2l_mask))

    def forward(
        self, src: Tensor, tgt: Tensor, r2l_memory: Tensor | None = None, r2l_mask: Tensor | None = None
    ) -> Tensor:
        """Logits for every target position; ``r2l_memory`` (B, S', d_model) and its mask (B, 1, 1, S')
        are the second memory of an ``r2l_memory=True`` decoder.

        Shape: src (B, S), tgt (B, T) -> logits (B, T, tgt_vocab_size)
        """
        return self.head(self.hidden(src, tgt, r2l_memory, r2l_mask))

    def attention_weights(
        self, src: Tensor, tgt: Tensor, r2l_memory: Tensor | None = None, r2l_mask: Tensor | None = None
    ) -> dict[str, list[Tensor]]:
        """Every layer's attention weights, for plotting.

        Returns ``{"encoder": [L × (B, h, S, S)], "decoder_self": [L × (B, h, T, T)],
        "cross": [L × (B, h, T, S)]}`` (and ``"cross_r2l"`` with a right-to-left memory).
        """
        context, enc_w = self._context_with_weights(src)
        context.r2l_memory, context.r2l_mask = r2l_memory, r2l_mask
        return {"encoder": enc_w, **self._decoder_weights(tgt, context)}

    def _context_with_weights(self, src: Tensor) -> tuple[DecoderContext, list[Tensor]]:
        """``context(src)`` and the encoder's attention weights, one (B, h, S, S) per layer."""
        src_mask = self.src_mask(src)
        memory, weights = self.encoder(self.src_embed(src), src_mask, need_weights=True)
        return DecoderContext(memory, src_mask), weights

    def _decoder_weights(self, tgt: Tensor, context: DecoderContext) -> dict[str, list[Tensor]]:
        _, dec_w = self.decode(tgt, context, need_weights=True)
        out = {}
        for key, name in (("self", "decoder_self"), ("cross", "cross"), ("cross_r2l", "cross_r2l")):
            if key in dec_w[0]:
                out[name] = [w[key] for w in dec_w]
        return out
