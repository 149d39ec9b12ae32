"""The encoder–decoder Transformer of the paper (Figure 1).

``Transformer(TransformerConfig())`` is the base model: 6+6 post-norm layers, d_model 512, 8 heads,
d_ff 2048, dropout 0.1, sinusoidal positions, source and target embeddings shared with the output
projection. ``encode`` and ``decode`` are separate so that decoding (greedy, beam search) runs the
encoder once and the decoder step by step with a ``DecoderCache``.
"""

from __future__ import annotations

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
        self.decoder = Decoder(c, c.n_decoder_layers, r2l=c.r2l_memory)
        init_weights(self, c.d_model)
        if c.share_embeddings:
            self.tgt_embed.tokens = self.src_embed.tokens
        self.head = make_head(c, c.tgt_vocab_size, self.tgt_embed if c.tie_output else None,
                              c.output_bias)  # fmt: skip
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
        start = 0 if cache is None else len(cache)
        x = self.tgt_embed(tgt, start)
        if tgt_mask is None and not (cache is not None and tgt.size(1) == 1):
            tgt_mask = causal_mask(tgt.size(1), start + tgt.size(1), tgt.device)
        h, weights = self.decoder(x, memory, tgt_mask, src_mask, r2l_memory, r2l_mask, need_weights, cache)
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
    ) -> Tensor | tuple[Tensor, Tensor, Tensor]:
        """Logits for every target position; ``r2l_memory`` (B, S', d_model) is the second memory
        of an ``r2l_memory=True`` decoder.

        With ``targets`` (the decoder input shifted left, padded with pad_id) it returns the
        training loss instead: summed label-smoothed loss, summed NLL and the number of real
        targets, with the output projection and the softmax computed at real target positions only
        and no smoothing mass on padding (``OutputProjection.loss``).

        Shape:
            src (B, S), tgt (B, T) -> logits (B, T, V); targets (B, T) -> three scalars
        """
        src_mask = self.src_mask(src)
        memory = self.encode(src, src_mask)
        h = self.decode(tgt, memory, src_mask, r2l_memory=r2l_memory, r2l_mask=r2l_mask)  # (B, T, d_model)
        if targets is None:
            return self.head(h)
        real = targets != self.config.pad_id  # (B, T)
        return self.head.loss(h[real], targets[real], label_smoothing, smoothing_exclude=self.config.pad_id)

    def attention_weights(
        self, src: Tensor, tgt: Tensor, r2l_memory: Tensor | None = None, r2l_mask: Tensor | None = None
    ) -> dict[str, list[Tensor]]:
        """Every layer's attention weights, for plotting.

        Returns ``{"encoder": [L × (B, h, S, S)], "decoder_self": [L × (B, h, T, T)],
        "cross": [L × (B, h, T, S)]}`` (and ``"cross_r2l"`` with a right-to-left memory).
        """
        src_mask = self.src_mask(src)
        memory, enc_w = self.encoder(self.src_embed(src), src_mask, need_weights=True)
        _, dec_w = self.decode(tgt, memory, src_mask, None, None, r2l_memory, r2l_mask, need_weights=True)
        out = {"encoder": enc_w}
        for key, name in (("self", "decoder_self"), ("cross", "cross"), ("cross_r2l", "cross_r2l")):
            if key in dec_w[0]:
                out[name] = [w[key] for w in dec_w]
        return out
