"""Token embeddings and positional encodings (paper §3.4, §3.5).

PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

``positional="sinusoidal_halves"`` is the same table with its columns permuted as Marian (OPUS-MT)
lays it out: all sines in dimensions 0 … d_model/2−1, all cosines in the second half.

Embeddings are multiplied by √d_model (§3.4) so that they are not drowned by the positional
encoding; ``scale="prj"`` instead divides the (tied) output projection by √d_model, and ``"none"``
does neither. Dropout is applied to the sum of embedding and position (§5.4); BERT normalises
the sum first (``norm=True``: Dropout(LayerNorm(embedding + position))).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.errors import ConfigError, DataError
from aiayn.modules.dropout import Dropout
from aiayn.modules.loss import fused_r_drop_loss, linear_label_smoothed_nll_loss
from aiayn.modules.norm import LayerNorm

EMB_SCALES = ("emb", "prj", "none")
POSITIONALS = ("sinusoidal", "sinusoidal_halves", "learned")


def sinusoidal_table(n_positions: int, d_model: int, halves: bool = False) -> Tensor:
    """The paper's table, sin on even and cos on odd dimensions (interleaved, not concatenated).

    ``halves=True`` gives Marian's layout instead: [sin(angles) | cos(angles)], as built by HF's
    ``MarianSinusoidalPositionalEmbedding`` (positions start at 0 in both). Computed in float64 so
    that large positions are exact to float32 precision.

    Shape:
        returns: (n_positions, d_model) float32
    """
    if d_model % 2:
        raise ConfigError(f"sinusoidal positional encoding needs an even d_model, got {d_model}")
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(1e4) / d_model))
    angles = pos * inv_freq  # (P, d_model/2): pos / 10000^(2i/d_model)
    if halves:
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.float()


class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding of positions ``start … start+T-1``.

    The table is precomputed for ``max_len`` positions and grows (doubling) when a longer input
    arrives, so there is no hard length limit. It is a non-persistent buffer: not in checkpoints.

    Shape:
        x: (B, T, d_model) -> (B, T, d_model)
    """

    def __init__(self, d_model: int, max_len: int = 1024, halves: bool = False):
        super().__init__()
        self.d_model = d_model
        self.halves = halves  # Marian's [sin | cos] layout instead of the paper's interleaving
        self.register_buffer("pe", sinusoidal_table(max_len, d_model, halves), persistent=False)

    def forward(self, x: Tensor, start: int | Tensor = 0) -> Tensor:
        end = _end(start, x)
        if end > self.pe.size(0):
            n = max(end, 2 * self.pe.size(0))
            self.pe = sinusoidal_table(n, self.d_model, self.halves).to(self.pe.device, self.pe.dtype)
        return x + _rows(self.pe, start, x)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned vector per position (the paper's §3.5 alternative, used by GPT-2).

    Shape:
        x: (B, T, d_model) -> (B, T, d_model)
    """

    def __init__(self, d_model: int, max_len: int = 1024):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor, start: int | Tensor = 0) -> Tensor:
        end = _end(start, x)
        if end > self.max_len:
            raise DataError(
                f"the sequence needs {end} positions but the learned positional embedding has "
                f"max_len={self.max_len}; shorten the input or train with a larger max_len"
            )
        return x + _rows(self.weight, start, x)


def _end(start: int | Tensor, x: Tensor) -> int:
    """One past the last position of ``x`` (B, T, d) whose rows start at ``start`` (an int, or (B,)
    when rows are at different positions: iteration-level batching): an int, the furthest row's."""
    return (start if isinstance(start, int) else int(start.max())) + x.size(1)


def _rows(table: Tensor, start: int | Tensor, x: Tensor) -> Tensor:
    """The table's rows for positions ``start … start + T - 1``: (T, d), or (B, T, d) per row."""
    if isinstance(start, int):
        return table[start : start + x.size(1)]
    return table[start[:, None] + torch.arange(x.size(1), device=start.device)]


class TokenEmbedding(nn.Module):
    """Token ids to vectors, times √d_model when ``scale="emb"`` (§3.4).

    Shape:
        ids: (B, T) -> (B, T, d_model)
    """

    def __init__(self, vocab_size: int, d_model: int, pad_id: int | None = 0, scale: str = "emb"):
        super().__init__()
        if scale not in EMB_SCALES:
            raise ConfigError(f"emb_scale={scale!r} is not one of {EMB_SCALES}")
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.scale = scale
        self.factor = math.sqrt(d_model)

    @property
    def weight(self) -> Tensor:
        return self.embedding.weight

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embedding(ids)
        return x * self.factor if self.scale == "emb" else x


class TransformerEmbedding(nn.Module):
    """Dropout(TokenEmbedding(ids) + Position(start … start+T-1)): the input of every stack
    (with ``norm``, the sum goes through a LayerNorm before the dropout, as in BERT).

    Shape:
        ids: (B, T) -> (B, T, d_model)
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        pad_id: int | None = 0,
        scale: str = "emb",
        positional: str = "sinusoidal",
        max_len: int = 1024,
        dropout: float = 0.1,
        norm: bool = False,
        ln_eps: float = 1e-5,
        bias: bool = True,  # the norm's β
    ):
        super().__init__()
        if positional not in POSITIONALS:
            raise ConfigError(f"positional={positional!r} is not one of {POSITIONALS}")
        self.tokens = TokenEmbedding(vocab_size, d_model, pad_id, scale)
        if positional == "learned":
            self.positions = LearnedPositionalEmbedding(d_model, max_len)
        else:
            self.positions = PositionalEncoding(d_model, max_len, halves=positional == "sinusoidal_halves")
        self.norm = LayerNorm(d_model, ln_eps, bias) if norm else None
        self.dropout = Dropout(dropout)

    def forward(self, ids: Tensor, start: int | Tensor = 0) -> Tensor:
        x = self.positions(self.tokens(ids), start)
        return self.dropout(x if self.norm is None else self.norm(x))


class OutputProjection(nn.Module):
    """The pre-softmax linear transformation: logits = h Wᵀ · scale (+ b).

    Models tie W to the target token embedding (§3.4) with ``tie(embedding)``; ``scale`` is
    1/√d_model for ``emb_scale="prj"``. ``b`` is optional (Marian's ``final_logits_bias``).
    ``loss`` is the projection and the label-smoothed loss fused, for training.

    With ``n_pieces > 0`` the layer scores only those ids of the vocabulary (``pieces``, a sorted
    buffer saved with the weights; ``set_pieces``), e.g. the pieces that ever occur on the target
    side of a joint vocabulary's training data: the products with W use only those rows, every
    other id gets logit −∞ (probability 0), and the loss is the softmax over the pieces. A target
    outside them counts as ``fallback`` (the unknown piece), which must be one of them.

    Shape:
        h: (B, T, d_model) -> (B, T, vocab)
    """

    def __init__(self, d_model: int, vocab_size: int, bias: bool = False, scale: float = 1.0,
                 n_pieces: int = 0, fallback: int = 0):  # fmt: skip
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None
        self.scale = scale
        self.fallback = fallback
        self.vocab_size = vocab_size
        self.pieces: Tensor | None
        self.register_buffer("pieces", torch.arange(n_pieces) if n_pieces else None)
        self.piece_proj: nn.Linear | None = None  # quantize's inference-only copy of W's piece rows

    def tie(self, tokens: TokenEmbedding) -> None:
        self.proj.weight = tokens.embedding.weight

    def set_pieces(self, ids: Tensor) -> None:
        """The ids this layer scores: ``n_pieces`` distinct ids, the fallback among them."""
        ids = torch.as_tensor(ids, dtype=torch.long).unique()  # sorted
        if self.pieces is None or ids.numel() != self.pieces.numel():
            raise ConfigError(f"set_pieces got {ids.numel()} distinct ids; this output layer was built for "
                              f"{0 if self.pieces is None else self.pieces.numel()} (n_pieces)")  # fmt: skip
        if int(ids[0]) < 0 or int(ids[-1]) >= self.vocab_size:
            raise ConfigError(f"set_pieces: ids must lie in [0, {self.vocab_size}) (the vocabulary)")
        if not bool((ids == self.fallback).any()):
            raise ConfigError(f"set_pieces: the fallback id {self.fallback} (unknown) is not among the ids")
        self.pieces.copy_(ids.to(self.pieces.device))

    def _piece_weights(self) -> tuple[Tensor, Tensor | None]:
        """W and b at the pieces' rows: (n_pieces, d_model), (n_pieces,)."""
        weight = self.proj.weight.index_select(0, self.pieces)
        return weight, None if self.bias is None else self.bias.index_select(0, self.pieces)

    def forward(self, h: Tensor) -> Tensor:
        if self.pieces is None:
            logits = self.proj(h)
        elif self.piece_proj is not None:
            logits = self.piece_proj(h)  # (B, T, n_pieces)
        else:
            logits = F.linear(h, self._piece_weights()[0])  # (B, T, n_pieces)
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.bias is not None:
            logits = logits + (self.bias if self.pieces is None else self.bias[self.pieces])
        if self.pieces is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))  # (B, T, vocab)
        return full.index_copy_(-1, self.pieces, logits)

    def full_bias(self) -> Tensor | None:
        """The bias over the whole vocabulary that makes a plain linear layer score as this one does:
        b (or 0) at the pieces, −∞ elsewhere; None without pieces and bias (for exporters)."""
        if self.pieces is None:
            return None if self.bias is None else self.bias.detach()
        bias = torch.full((self.vocab_size,), float("-inf"), device=self.pieces.device)
        at_pieces = (torch.zeros(self.pieces.numel(), device=bias.device) if self.bias is None
                     else self.bias.detach()[self.pieces].float())  # fmt: skip
        return bias.index_copy_(0, self.pieces, at_pieces)

    def split_pieces(self) -> None:
        """An untied ``nn.Linear`` holding W's piece rows (for ``quantize``, which converts Linears)."""
        if self.pieces is not None and self.piece_proj is None:
            weight = self._piece_weights()[0].detach()
            self.piece_proj = nn.Linear(weight.size(1), weight.size(0), bias=False, device=weight.device)
            self.piece_proj.weight = nn.Parameter(weight.clone(), requires_grad=False)

    def loss(
        self, h: Tensor, target: Tensor, epsilon: float, smoothing_exclude: int | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Summed label-smoothed loss, summed NLL and the number of targets of ``softmax(self(h))``
        against ``target``, without storing the (N, V) logits (``linear_label_smoothed_nll_loss``).
        With pieces, the softmax and the smoothing mass span the pieces only.

        Shape:
            h: (N, d_model), target: (N,) -> three scalars
        """
        weight, bias, column, exclude = self._loss_terms(target, smoothing_exclude)
        return linear_label_smoothed_nll_loss(h, weight, column, epsilon, bias, self.scale,
                                              smoothing_exclude=exclude)  # fmt: skip

    def r_drop_loss(
        self, h_a: Tensor, h_b: Tensor, target: Tensor, epsilon: float, alpha: float,
        smoothing_exclude: int | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """``loss`` for two dropout passes of the same targets with R-Drop's consistency term
        (``aiayn.modules.loss.r_drop_loss``). The (N, V) logits of both passes are stored: the KL
        term needs them whole. With pieces, both distributions span the pieces only.

        Shape:
            h_a, h_b: (N, d_model), target: (N,) -> three scalars
        """
        weight, bias, column, exclude = self._loss_terms(target, smoothing_exclude)
        logits = F.linear(torch.cat([h_a, h_b]), weight)  # (2N, V')
        if self.scale != 1.0:
            logits = logits * self.scale
        if bias is not None:
            logits = logits + bias
        return fused_r_drop_loss(logits, column, epsilon, alpha, smoothing_exclude=exclude)

    def _loss_terms(self, target: Tensor, smoothing_exclude: int | None):
        """(W, b, target columns, excluded column) of the softmax the loss spans: the whole vocabulary,
        or the pieces' rows, with ids mapped to their columns (outside the pieces: the fallback)."""
        if self.pieces is None:
            return self.proj.weight, self.bias, target, smoothing_exclude
        position = torch.full((self.vocab_size,), -1, dtype=torch.long, device=self.pieces.device)
        position[self.pieces] = torch.arange(self.pieces.numel(), device=self.pieces.device)  # id -> column
        column = position[target]  # (N,)
        column = torch.where(column < 0, position[self.fallback], column)
        exclude = None if smoothing_exclude is None else int(position[smoothing_exclude])
        exclude = None if exclude is None or exclude < 0 else exclude  # padding is rarely a piece
        weight, bias = self._piece_weights()
        return weight, bias, column, exclude
