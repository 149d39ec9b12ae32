"""What the three models share: building embeddings and heads from a config, and initialisation."""

from __future__ import annotations

import math

from torch import nn

from aiayn.modules.config import LayerConfig
from aiayn.modules.embedding import OutputProjection, TransformerEmbedding


def make_embedding(cfg: LayerConfig, vocab_size: int, norm: bool = False) -> TransformerEmbedding:
    return TransformerEmbedding(
        vocab_size, cfg.d_model, cfg.pad_id, cfg.emb_scale, cfg.positional, cfg.max_len, cfg.dropout,
        norm, cfg.ln_eps, cfg.bias,
    )  # fmt: skip


def make_head(cfg: LayerConfig, vocab_size: int, tie_to: TransformerEmbedding | None, bias: bool = False,
              n_pieces: int = 0) -> OutputProjection:  # fmt: skip
    """The output projection, tied to ``tie_to``'s token embedding unless it is None; with
    ``n_pieces`` it scores only that many ids of the vocabulary (``OutputProjection.set_pieces``)."""
    scale = 1 / math.sqrt(cfg.d_model) if cfg.emb_scale == "prj" and tie_to is not None else 1.0
    head = OutputProjection(cfg.d_model, vocab_size, bias, scale, n_pieces, fallback=cfg.unk_id)
    if tie_to is not None:
        head.tie(tie_to.tokens)
    return head


def init_weights(model: nn.Module, d_model: int) -> None:
    """Xavier-uniform linear weights with zero biases; token embeddings N(0, d_model^-0.5).

    Embeddings are scaled by √d_model on the way in, so that init gives them unit variance
    (tensor2tensor, fairseq). The padding row starts at zero (``padding_idx`` keeps the lookup
    from training it; with a tied output projection the softmax still moves it, which is harmless:
    padding is masked as a key and never a target). Call before tying the output projection, so
    that a tied matrix keeps the embedding's initialisation.
    """
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=d_model**-0.5)
            if m.padding_idx is not None:
                m.weight.data[m.padding_idx].zero_()


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
