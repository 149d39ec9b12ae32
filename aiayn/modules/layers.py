"""Encoder and decoder layers and stacks (paper §3.1, Figure 1).

Each sublayer is wrapped in a residual connection with layer normalisation:
    post-norm (paper, ``norm_first=False``):  x = LayerNorm(x + Dropout(Sublayer(x)))
    pre-norm  (``norm_first=True``):          x = x + Dropout(Sublayer(LayerNorm(x)))
A pre-norm stack ends with one more LayerNorm, since its residual stream is never normalised.

Stacks hold N *independent* layers (each built afresh), never N references to one layer.
Masks follow ``aiayn.masks``: bool, True = may attend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.modules.attention import MultiHeadAttention
from aiayn.modules.dropout import Dropout
from aiayn.modules.feed_forward import FeedForward
from aiayn.modules.kv_cache import DecoderCache
from aiayn.modules.norm import LayerNorm

if TYPE_CHECKING:
    from aiayn.modules.config import LayerConfig


class Residual(nn.Module):
    """The residual connection and LayerNorm around one sublayer.

    ``x = res.add(x, sublayer(res.normed(x)))`` is post-norm or pre-norm by ``norm_first``.

    Shape:
        x, h: (B, T, d_model) -> (B, T, d_model)
    """

    def __init__(self, cfg: LayerConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.norm = LayerNorm(cfg.d_model, cfg.ln_eps, cfg.bias)
        self.dropout = Dropout(cfg.dropout)

    def normed(self, x: Tensor) -> Tensor:
        """The sublayer's input: LayerNorm(x) for pre-norm, x itself for post-norm."""
        return self.norm(x) if self.norm_first else x

    def add(self, x: Tensor, h: Tensor) -> Tensor:
        """x + Dropout(h), normalised afterwards for post-norm."""
        x = self.dropout.add(x, h)
        return x if self.norm_first else self.norm(x)


@dataclass
class DecoderContext:
    """What a decoder reads besides its own input: the encoder memory and, for a decoder built with
    the fourth sublayer, the right-to-left memory, each with its key mask (bool, True = may attend).

    Shape:
        memory: (B, S, d_model), memory_mask: broadcastable to (B, h, T, S)
        r2l_memory: (B, S', d_model), r2l_mask: broadcastable to (B, h, T, S')
    """

    memory: Tensor
    memory_mask: Tensor | None = None
    r2l_memory: Tensor | None = None
    r2l_mask: Tensor | None = None

    def select(self, index: Tensor) -> DecoderContext:
        """The rows ``index`` of every tensor (beam search reorders and repeats rows with it)."""
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return DecoderContext(pick(self.memory), pick(self.memory_mask), pick(self.r2l_memory),
                              pick(self.r2l_mask))  # fmt: skip

    def join(self, other: DecoderContext) -> DecoderContext:
        """This context's rows then ``other``'s; the shorter memory is padded (its mask hides it).
        Both have a padding mask per row and no right-to-left memory (plain decoders)."""
        if self.r2l_memory is not None or other.r2l_memory is not None:
            raise ValueError("contexts with a right-to-left memory cannot be joined")
        s = max(self.memory.size(1), other.memory.size(1))
        memory = torch.cat([F.pad(m, (0, 0, 0, s - m.size(1))) for m in (self.memory, other.memory)])
        masks = [torch.ones(c.memory.shape[:2], dtype=torch.bool, device=c.memory.device)[:, None, None]
                 if c.memory_mask is None else c.memory_mask.expand(c.memory.size(0), 1, 1, -1)
                 for c in (self, other)]  # fmt: skip
        return DecoderContext(memory, torch.cat([F.pad(m, (0, s - m.size(-1)), value=False) for m in masks]))


def _slot(cache: dict | None, name: str):
    return None if cache is None else cache[name]


def _attention(cfg: LayerConfig) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.d_k, cfg.d_v, cfg.attn_dropout, cfg.bias)


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual connection (Figure 1, left).

    With a causal mask and a cache this is also the layer of a decoder-only (GPT-style) model.

    Shape:
        x: (B, T, d_model), mask: bool broadcastable to (B, h, T, T)
        returns: x (B, T, d_model), self-attention weights (B, h, T, T) or None
    """

    def __init__(self, cfg: LayerConfig):
        super().__init__()
        self.self_attn = _attention(cfg)
        self.self_attn_res = Residual(cfg)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.ff_dropout, cfg.activation, cfg.bias)
        self.ff_res = Residual(cfg)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        cache: dict | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        h = self.self_attn_res.normed(x)
        h, weights = self.self_attn(h, h, h, mask, need_weights, _slot(cache, "self"))
        x = self.self_attn_res.add(x, h)
        x = self.ff_res.add(x, self.ff(self.ff_res.normed(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder memory, feed-forward (Figure 1, right).

    With ``r2l=True`` a second cross-attention attends to a right-to-left memory (e.g. the states of
    a decoder that read the target backwards) after the first.

    Shape:
        x: (B, T, d_model), context: ``DecoderContext`` (memory (B, S, d_model) and its mask)
        self_mask: bool broadcastable to (B, h, T, T_total)
        returns: x (B, T, d_model), {"self", "cross"[, "cross_r2l"]: weights (B, h, T, ·)}
    """

    def __init__(self, cfg: LayerConfig, r2l: bool = False):
        super().__init__()
        self.self_attn = _attention(cfg)
        self.self_attn_res = Residual(cfg)
        self.cross_attn = _attention(cfg)
        self.cross_attn_res = Residual(cfg)
        self.cross_attn_r2l = _attention(cfg) if r2l else None
        self.cross_attn_r2l_res = Residual(cfg) if r2l else None
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.ff_dropout, cfg.activation, cfg.bias)
        self.ff_res = Residual(cfg)

    def forward(
        self,
        x: Tensor,
        context: DecoderContext,
        self_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: dict | None = None,
    ) -> tuple[Tensor, dict[str, Tensor | None]]:
        c, weights = context, {}
        h = self.self_attn_res.normed(x)
        h, weights["self"] = self.self_attn(h, h, h, self_mask, need_weights, _slot(cache, "self"))
        x = self.self_attn_res.add(x, h)

        h = self.cross_attn_res.normed(x)
        h, weights["cross"] = self.cross_attn(
            h, c.memory, c.memory, c.memory_mask, need_weights, _slot(cache, "cross")
        )
        x = self.cross_attn_res.add(x, h)

        if self.cross_attn_r2l is not None:
            if c.r2l_memory is None:
                raise ValueError(
                    "this decoder layer was built with r2l=True (a model's r2l_memory=True or "
                    "bidirectional=True): pass r2l_memory"
                )
            h = self.cross_attn_r2l_res.normed(x)
            h, weights["cross_r2l"] = self.cross_attn_r2l(
                h, c.r2l_memory, c.r2l_memory, c.r2l_mask, need_weights, _slot(cache, "cross_r2l")
            )
            x = self.cross_attn_r2l_res.add(x, h)

        x = self.ff_res.add(x, self.ff(self.ff_res.normed(x)))
        return x, weights


class Encoder(nn.Module):
    """N encoder layers (plus a final LayerNorm when pre-norm).

    Shape:
        x: (B, T, d_model) -> (B, T, d_model); weights: one (B, h, T, T) per layer if asked
    """

    def __init__(self, cfg: LayerConfig, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(n_layers))
        self.norm = LayerNorm(cfg.d_model, cfg.ln_eps, cfg.bias) if cfg.norm_first else None

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        all_weights = []
        for i, layer in enumerate(self.layers):
            x, w = layer(x, mask, need_weights, None if cache is None else cache.layers[i])
            all_weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return x, all_weights if need_weights else []


class Decoder(nn.Module):
    """N decoder layers (plus a final LayerNorm when pre-norm).

    Shape:
        x: (B, T, d_model), context: ``DecoderContext`` -> (B, T, d_model)
    """

    def __init__(self, cfg: LayerConfig, n_layers: int, r2l: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg, r2l) for _ in range(n_layers))
        self.norm = LayerNorm(cfg.d_model, cfg.ln_eps, cfg.bias) if cfg.norm_first else None

    def prime(self, context: DecoderContext, cache: DecoderCache, rows: int) -> None:
        """Fill an empty ``cache`` for ``rows`` decoder rows before their first token: every layer's
        cross-attention keys and values from the memory (as its first step would project them),
        and empty self-attention buffers. Rows primed so join a running batch without a step of
        their own (``decoding.running``)."""
        for layer, slots in zip(self.layers, cache.layers, strict=True):
            k, v = layer.cross_attn.project_memory(context.memory)
            slots["cross"].update(k, v)
            if layer.cross_attn_r2l is not None and context.r2l_memory is not None:
                slots["cross_r2l"].update(*layer.cross_attn_r2l.project_memory(context.r2l_memory))
            slots["self"].update(
                k.new_empty(rows, k.size(1), 0, k.size(3)), v.new_empty(rows, v.size(1), 0, v.size(3))
            )

    def forward(
        self,
        x: Tensor,
        context: DecoderContext,
        self_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> tuple[Tensor, list[dict[str, Tensor | None]]]:
        all_weights = []
        for i, layer in enumerate(self.layers):
            x, w = layer(x, context, self_mask, need_weights, None if cache is None else cache.layers[i])
            all_weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return x, all_weights if need_weights else []
