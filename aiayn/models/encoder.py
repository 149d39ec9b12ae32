"""An encoder-only model: a vocabulary head on every position and a pooled classification head.

The encoder sees the whole sequence (no look-ahead mask), as in BERT, unless ``causal`` (each
position then sees itself and earlier ones, as a GPT; causal-LM pre-training trains it so); padding
is masked. Masked-LM pre-training predicts the tokens at chosen positions from the per-token states;
classification pools the states into one vector per sequence (the mean over real tokens, or the
first token, which the data module makes ``bos``, BERT's [CLS]) and projects it to class logits.

With ``detector`` the model also has ELECTRA's discriminator head (Clark et al. 2020): one logit
per token, "this token was replaced", which replaced-token detection pre-trains (``task="rtd"``).

With the BERT fields of ``EncoderConfig`` on, the model is BERT's layer for layer
(``aiayn.interop.bert`` maps it to Hugging Face's ``BertForMaskedLM`` /
``BertForSequenceClassification``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.masks import causal_mask, padding_mask, window_mask
from aiayn.models.common import init_weights, make_embedding, make_head
from aiayn.models.config import EncoderConfig
from aiayn.modules.dropout import Dropout
from aiayn.modules.feed_forward import ACTIVATIONS
from aiayn.modules.layers import Encoder
from aiayn.modules.norm import LayerNorm


class HeadTransform(nn.Module):
    """BERT's transform before the vocabulary projection: LayerNorm(act(h W + b)).

    Shape:
        h: (..., d_model) -> (..., d_model)
    """

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(c.d_model, c.d_model, bias=c.bias)
        self.act = ACTIVATIONS[c.activation]
        self.norm = LayerNorm(c.d_model, c.ln_eps, c.bias)

    def forward(self, h: Tensor) -> Tensor:
        return self.norm(self.act(self.dense(h)))


class Classifier(nn.Module):
    """pooled -> [tanh(W_p · pooled + b_p)] -> Dropout -> W_c · + b_c (BERT's pooler optional).

    Shape:
        pooled: (B, d_model) -> (B, n_classes)
    """

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.pooler = nn.Linear(c.d_model, c.d_model, bias=c.bias) if c.pooler else None
        self.dropout = Dropout(c.dropout)
        self.out = nn.Linear(c.d_model, c.n_classes, bias=c.bias)

    def forward(self, pooled: Tensor) -> Tensor:
        if self.pooler is not None:
            pooled = self.pooler(pooled).tanh()
        return self.out(self.dropout(pooled))


class Detector(nn.Module):
    """ELECTRA's discriminator head: a per-token logit w · act(W h + b) + b' (positive = replaced).

    Shape:
        h: (..., d_model) -> (...)
    """

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(c.d_model, c.d_model, bias=c.bias)
        self.act = ACTIVATIONS[c.activation]
        self.out = nn.Linear(c.d_model, 1, bias=c.bias)

    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.act(self.dense(h))).squeeze(-1)


class EncoderModel(nn.Module):
    """Per-token logits = Project(Encoder(Embed(ids))); class logits = Classifier(Pool(states)).

    Shape:
        ids: (B, T) -> logits (B, T, vocab_size); classify: (B, T) -> (B, n_classes)
    """

    def __init__(self, config: EncoderConfig | None = None):
        super().__init__()
        c = self.config = config or EncoderConfig()
        self.embed = make_embedding(c, c.vocab_size, norm=c.embed_norm)
        self.encoder = Encoder(c, c.n_layers)
        self.classifier = Classifier(c) if c.n_classes else None
        self.transform = HeadTransform(c) if c.head_transform else None
        self.detector = Detector(c) if c.detector else None
        init_weights(self, c.d_model)
        self.head = make_head(c, c.vocab_size, self.embed if c.tie_output else None, bias=c.output_bias)
        if not c.tie_output:
            init_weights(self.head, c.d_model)

    def encode(
        self, ids: Tensor, need_weights: bool = False, embedded: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """The encoder over ``embed(ids)``, or over ``embedded`` in its place (adversarial training
        perturbs the embedded input; the masks still come from ``ids``).

        Shape: ids (B, T) [, embedded (B, T, d_model)] -> states (B, T, d_model), [L × (B, h, T, T)] if asked
        """
        mask = padding_mask(ids, self.config.pad_id)  # (B, 1, 1, T)
        if self.config.causal:
            mask = mask & causal_mask(ids.size(1), device=ids.device)  # (B, 1, T, T)
        if self.config.attn_window:
            mask = mask & window_mask(ids.size(1), self.config.attn_window, ids.device)  # (B, 1, T, T)
        return self.encoder(self.embed(ids) if embedded is None else embedded, mask, need_weights)

    def token_states(self, h: Tensor) -> Tensor:
        """What the vocabulary projection reads: the states, through BERT's transform if any."""
        return h if self.transform is None else self.transform(h)

    def forward(self, ids: Tensor) -> Tensor:
        """Per-token logits (the losses are the training tasks': ``aiayn.training.criteria``).

        Shape: ids (B, T) -> (B, T, vocab_size)
        """
        return self.head(self.token_states(self.encode(ids)[0]))

    def pool(self, ids: Tensor, states: Tensor) -> Tensor:
        """Shape: ids (B, T), states (B, T, d_model) -> (B, d_model)."""
        if self.config.pooling == "first":
            return states[:, 0]
        real = (ids != self.config.pad_id).unsqueeze(-1)  # (B, T, 1)
        if self.config.pooling == "max":  # each feature's largest over the real tokens (none: 0, as mean)
            pooled = states.masked_fill(~real, torch.finfo(states.dtype).min).amax(1)
            return pooled.masked_fill(~real.any(1), 0.0)
        real = real.to(states.dtype)
        return (states * real).sum(1) / real.sum(1).clamp(min=1)

    def classify(self, ids: Tensor, embedded: Tensor | None = None) -> Tensor:
        """Class logits (``embedded`` as in ``encode``). Shape: ids (B, T) -> (B, n_classes)."""
        if self.classifier is None:
            raise ValueError("this model has no classification head: set n_classes > 0")
        return self.classifier(self.pool(ids, self.encode(ids, embedded=embedded)[0]))

    def detect(self, ids: Tensor) -> Tensor:
        """Replaced-token logits (positive = replaced). Shape: ids (B, T) -> (B, T)."""
        if self.detector is None:
            raise ValueError("this model has no replaced-token detection head: set detector=True")
        return self.detector(self.encode(ids)[0])

    def attention_weights(self, ids: Tensor) -> dict[str, list[Tensor]]:
        """``{"encoder": [L × (B, h, T, T)]}``."""
        return {"encoder": self.encode(ids, need_weights=True)[1]}
