"""An encoder-only model: a vocabulary head on every position and a pooled classification head.

The encoder sees the whole sequence (no look-ahead mask), as in BERT; padding is masked.
``classify`` mean-pools the final states over real (non-padding) tokens.
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.masks import padding_mask
from aiayn.models.common import init_weights, make_embedding, make_head
from aiayn.models.config import EncoderConfig
from aiayn.modules.dropout import Dropout
from aiayn.modules.layers import Encoder


class EncoderModel(nn.Module):
    """Per-token logits = Project(Encoder(Embed(ids))); class logits = W · mean_t(states).

    Shape:
        ids: (B, T) -> logits (B, T, vocab_size); classify: (B, T) -> (B, n_classes)
    """

    def __init__(self, config: EncoderConfig | None = None):
        super().__init__()
        c = self.config = config or EncoderConfig()
        self.embed = make_embedding(c, c.vocab_size)
        self.encoder = Encoder(c, c.n_layers)
        self.classifier = (
            nn.Sequential(Dropout(c.dropout), nn.Linear(c.d_model, c.n_classes)) if c.n_classes else None
        )
        init_weights(self, c.d_model)
        self.head = make_head(c, c.vocab_size, self.embed if c.tie_output else None)
        if not c.tie_output:
            init_weights(self.head, c.d_model)

    def encode(self, ids: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Shape: ids (B, T) -> states (B, T, d_model), [L × (B, h, T, T)] if asked."""
        return self.encoder(self.embed(ids), padding_mask(ids, self.config.pad_id), need_weights)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.encode(ids)[0])

    def classify(self, ids: Tensor) -> Tensor:
        if self.classifier is None:
            raise ValueError("this model has no classification head: set n_classes > 0")
        states = self.encode(ids)[0]
        real = (ids != self.config.pad_id).unsqueeze(-1).to(states.dtype)  # (B, T, 1)
        pooled = (states * real).sum(1) / real.sum(1).clamp(min=1)  # (B, d_model)
        return self.classifier(pooled)

    def attention_weights(self, ids: Tensor) -> dict[str, list[Tensor]]:
        """``{"encoder": [L × (B, h, T, T)]}``."""
        return {"encoder": self.encode(ids, need_weights=True)[1]}
