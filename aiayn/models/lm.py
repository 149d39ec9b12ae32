"""A decoder-only (GPT-style) language model: embeddings, causal self-attention layers, tied head.

There is no encoder and no cross-attention, so each layer is an ``EncoderLayer`` run under the
look-ahead mask. ``LanguageModel(LMConfig())`` keeps the paper's layer defaults; GPT-2-like models
set ``norm_first=True, positional="learned", activation="gelu_tanh"``.
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.masks import causal_mask
from aiayn.models.common import init_weights, make_embedding, make_head
from aiayn.models.config import LMConfig
from aiayn.modules.kv_cache import DecoderCache
from aiayn.modules.layers import Encoder


class LanguageModel(nn.Module):
    """logits_t = Project(Layers(Embed(ids))_t), position t seeing ids ≤ t only.

    Shape:
        ids: (B, T) -> logits (B, T, vocab_size)
    """

    def __init__(self, config: LMConfig | None = None):
        super().__init__()
        c = self.config = config or LMConfig()
        self.embed = make_embedding(c, c.vocab_size)
        self.layers = Encoder(c, c.n_layers)
        init_weights(self, c.d_model)
        self.head = make_head(c, c.vocab_size, self.embed if c.tie_output else None)
        if not c.tie_output:
            init_weights(self.head, c.d_model)

    def hidden(
        self,
        ids: Tensor,
        mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        start = 0 if cache is None else len(cache)
        if mask is None and not (cache is not None and ids.size(1) == 1):
            mask = causal_mask(ids.size(1), start + ids.size(1), ids.device)
        return self.layers(self.embed(ids, start), mask, need_weights, cache)

    def forward(self, ids: Tensor, mask: Tensor | None = None, cache: DecoderCache | None = None) -> Tensor:
        """Logits; ``mask`` defaults to the look-ahead mask; with a cache, only new positions are
        given. The loss is the training task's (``aiayn.training.criteria.next_token_loss``).

        Shape: ids (B, T) -> (B, T, vocab_size)
        """
        return self.head(self.hidden(ids, mask, cache)[0])

    def new_cache(self) -> DecoderCache:
        return DecoderCache(len(self.layers.layers))

    def attention_weights(self, ids: Tensor) -> dict[str, list[Tensor]]:
        """``{"decoder_self": [L × (B, h, T, T)]}``."""
        return {"decoder_self": self.hidden(ids, need_weights=True)[1]}
