"""Scaled dot-product attention and multi-head attention (paper §3.2).

Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V                                      (eq. 1)
MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Masks follow the package convention (``aiayn.masks``): bool, ``True`` = may attend. A query whose
every key is masked gets a zero output and zero weights instead of the NaN that a plain ``-inf``
fill produces. Nothing here builds masks or caches; ``MultiHeadAttention`` only reads and extends a
``KVCache`` it is handed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.errors import ConfigError
from aiayn.modules.dropout import dropout
from aiayn.modules.kv_cache import KVCache

_compiling = getattr(torch.compiler, "is_compiling", lambda: False)  # torch ≥ 2.3


def _guard_empty_rows(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """Let fully masked query rows attend everywhere (so softmax stays finite), and report them.

    Returns the safe mask and ``row_ok`` (``(..., T_q, 1)``, False where a row had nothing to attend
    to), whose outputs the caller zeroes. Gradients stay finite too, unlike a NaN that is filled later.
    """
    if mask is None:
        return None, None
    row_ok = mask.any(dim=-1, keepdim=True)
    # the usual case, nothing to guard or zero, checked on the CPU only: on an accelerator the check
    # costs a synchronisation, and under torch.compile a graph break
    if mask.device.type == "cpu" and not _compiling() and bool(row_ok.all()):
        return mask, None
    return mask | ~row_ok, row_ok


# Keys up to this many are attended with the explicit products on the CPU: for sentence-length
# sequences the three batched products beat the fused kernel in forward + backward, which tiles for
# long ones and, with one thread, wins a little past this length. A single query (a decoding step)
# has its own rule (below). benchmarks/attention_kernels.py
# measures both paths by key length; docs/results.md ("Attention over short keys") has the figures.
EXPLICIT_MAX_KEYS = 40
# Training in bfloat16 (autocast) moves the crossover far out: the fused kernel's backward is slow in
# bfloat16 on the CPU, so the explicit products stay the faster forward + backward to a few hundred
# keys; past 256 the gain shrinks while the explicit scores grow as T². Without gradients the
# float32 threshold holds (forward only, the two are even). benchmarks/attention_kernels.py
# --precision bf16 measures it; docs/results.md ("Attention and the loss in bf16") has the figures.
EXPLICIT_MAX_KEYS_BF16_TRAINING = 256


# A single query per row (a decoding step) keeps the fused kernel where there are few rows, which it
# serves faster; over a batch of beams (batch × heads rows) with 8–256 keys the explicit products are
# faster in float32, whose tiles hold one query each. docs/inference.md ("One query per row") has the
# figures.
EXPLICIT_MIN_SINGLE_QUERIES = 512
EXPLICIT_SINGLE_QUERY_KEYS = (8, 256)


def _explicit_is_faster(q: Tensor, k: Tensor) -> bool:
    if q.device.type != "cpu":
        return False
    if q.size(-2) == 1:
        fewest, most = EXPLICIT_SINGLE_QUERY_KEYS
        many_rows = q.numel() // q.size(-1) >= EXPLICIT_MIN_SINGLE_QUERIES  # batch × heads
        return q.dtype == torch.float32 and many_rows and fewest <= k.size(-2) <= most
    bf16_training = q.dtype == torch.bfloat16 and torch.is_grad_enabled() and q.requires_grad
    return k.size(-2) <= (EXPLICIT_MAX_KEYS_BF16_TRAINING if bf16_training else EXPLICIT_MAX_KEYS)


def _simd_floats() -> int:
    """float32 lanes of the vectors PyTorch's CPU kernels run with on this machine."""
    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


# PyTorch's CPU softmax over the last dimension reduces a row shorter than one vector (16 float32
# lanes with AVX-512, 8 with AVX2) lane by lane, at many times the cost per element of a full
# vector's row, forward and backward. Most Multi30k sentences are shorter than 16 pieces, so short
# rows are padded with −∞ (probability 0) to one vector and the padding is sliced off again.
# A vector holds twice as many bfloat16 (or float16) values, and so their rows are padded to twice
# the length: under bf16 autocast the scores are bfloat16, and rows shorter than 32 are slow there.
# benchmarks/attention_kernels.py measures both softmaxes by row length ("softmax_rows");
# docs/results.md ("Short softmax rows", "Attention and the loss in bf16") has the figures.
SOFTMAX_MIN_ROW = _simd_floats()


def softmax_last(scores: Tensor) -> Tensor:
    """``scores.softmax(dim=-1)``, computed over rows padded to one SIMD vector on the CPU
    (``SOFTMAX_MIN_ROW`` values, twice that for 2-byte dtypes).

    Shape:
        scores: (..., T_k) -> (..., T_k), a view of a (..., min_row) tensor for short rows
    """
    n = scores.size(-1)
    min_row = SOFTMAX_MIN_ROW * 2 if scores.element_size() == 2 else SOFTMAX_MIN_ROW
    if scores.device.type != "cpu" or n >= min_row:
        return scores.softmax(dim=-1)
    padded = F.pad(scores, (0, min_row - n), value=float("-inf"))  # exp(−∞) = 0: sums unchanged
    return padded.softmax(dim=-1)[..., :n]


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q Kᵀ / √d_k) V, with an optional boolean mask (True = may attend).

    With ``need_weights`` the scores are computed explicitly so the weights can be returned; without
    it, the fused ``F.scaled_dot_product_attention`` kernel runs, except where the explicit products
    are faster on the CPU (``_explicit_is_faster``: short keys, ``EXPLICIT_MAX_KEYS``; single queries
    over many rows and 8–256 keys). Both give the same output.
    ``dropout_p`` is applied to the weights; pass 0 at evaluation time.

    Shape:
        q: (..., T_q, d_k), k: (..., T_k, d_k), v: (..., T_k, d_v)
        mask: bool, broadcastable to (..., T_q, T_k)
        returns: output (..., T_q, d_v), weights (..., T_q, T_k) or None
    """
    mask, row_ok = _guard_empty_rows(mask)
    if need_weights or _explicit_is_faster(q, k):
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (..., T_q, T_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = softmax_last(scores)
        if row_ok is not None:
            weights = weights.masked_fill(~row_ok, 0.0)
        out = dropout(weights, dropout_p) @ v
        return out, weights if need_weights else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    if row_ok is not None:
        out = out.masked_fill(~row_ok, 0.0)
    return out, None


class MultiHeadAttention(nn.Module):
    """Multi-head attention with free d_k and d_v (default d_model / n_heads each).

    The query, key and value projections W^Q, W^K, W^V of all heads are stored as one matrix
    ``w_qkv`` (rows: h·d_k for queries, h·d_k for keys, h·d_v for values), so self-attention costs one
    matrix product and cross-attention two (queries from the decoder, keys and values from memory).

    Shape:
        query: (B, T_q, d_model), key: (B, T_k, d_model), value: (B, T_k, d_model)
        mask: bool, broadcastable to (B, h, T_q, T_k)
        returns: output (B, T_q, d_model), weights (B, h, T_q, T_k) or None
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_k: int | None = None,
        d_v: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ):
        super().__init__()
        if (d_k is None or d_v is None) and d_model % n_heads:
            raise ConfigError(
                f"d_model={d_model} must be divisible by n_heads={n_heads} (or give d_k and d_v explicitly)"
            )
        self.n_heads = n_heads
        self.d_k = d_k or d_model // n_heads
        self.d_v = d_v or d_model // n_heads
        self.dropout = dropout
        hk, hv = n_heads * self.d_k, n_heads * self.d_v
        self.w_qkv = nn.Linear(d_model, 2 * hk + hv, bias=bias)  # [W^Q; W^K; W^V] of all heads
        self.w_o = nn.Linear(hv, d_model, bias=bias)  # W^O
        self._split = (hk, hk, hv)
        # the row blocks of w_qkv that cross-attention applies on their own
        self._rows = {"q": (0, hk), "kv": (hk, 2 * hk + hv), "k": (hk, 2 * hk), "v": (2 * hk, 2 * hk + hv)}
        self.row_blocks: nn.ModuleDict | None = None  # set by split_row_blocks (quantized, packed models)

    def split_row_blocks(self) -> None:
        """For attention over a memory (cross-attention): copy the rows of ``w_qkv`` it applies, W^Q's
        and [W^K; W^V], into Linears of their own, and drop ``w_qkv``, whose whole product it never
        computes (its keys and values come from one memory). A quantized or packed Linear cannot be
        sliced; after this, ``aiayn.models.quantize`` and ``prepack`` convert these copies as well.
        Outputs are unchanged; self-attention (one product of ``w_qkv``) is never split. Once is
        enough: a split attention is left as it is."""
        if self.row_blocks is not None:
            return
        w, b = self.w_qkv.weight.detach(), self.w_qkv.bias
        blocks = nn.ModuleDict()
        for name in ("q", "kv"):
            start, stop = self._rows[name]
            block = nn.Linear(w.size(1), stop - start, bias=b is not None).to(w)
            block.weight.data.copy_(w[start:stop])
            if b is not None:
                block.bias.data.copy_(b.detach()[start:stop])
            blocks[name] = block
        self.row_blocks, self.w_qkv = blocks, None

    def _project(self, x: Tensor, rows: str) -> Tensor:
        """A row block of the stacked projection (``self._rows[rows]``) applied to x."""
        if self.row_blocks is not None:
            if rows not in self.row_blocks:
                raise RuntimeError(f"this attention was split to read one memory (split_row_blocks): "
                                   f"it has no {rows!r} block")  # fmt: skip
            return self.row_blocks[rows](x)
        start, stop = self._rows[rows]
        b = self.w_qkv.bias
        return F.linear(x, self.w_qkv.weight[start:stop], None if b is None else b[start:stop])  # a view

    def project_qkv(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, ...]:
        """Q W^Q, K W^K, V W^V with as few matrix products as the inputs allow."""
        hk, _, hv = self._split
        if key is query and value is query:  # self-attention: one product
            return self.w_qkv(query).split(self._split, dim=-1)
        q = self._project(query, "q")
        if key is value:  # cross-attention: keys and values from the same memory
            k, v = self._project(key, "kv").split((hk, hv), dim=-1)
            return q, k, v
        return q, self._project(key, "k"), self._project(value, "v")

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values of a memory, split into heads, as cross-attention computes them at
        its first step (what a ``KVCache(static=True)`` holds).

        Shape: memory (B, S, d_model) -> k (B, h, S, d_k), v (B, h, S, d_v)"""
        k, v = self._project(memory, "kv").split(self._split[1:], dim=-1)
        return self._heads(k, self.d_k), self._heads(v, self.d_v)

    def _heads(self, x: Tensor, d: int) -> Tensor:
        return x.view(x.size(0), x.size(1), self.n_heads, d).transpose(1, 2)  # (B, h, T, d)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        if cache is not None and cache.static and cache.k is not None:
            # cross-attention while decoding: memory keys/values were projected at the first step
            q = self._heads(self._project(query, "q"), self.d_k)
            k, v = cache.k, cache.v
        else:
            q, k, v = self.project_qkv(query, key, value)
            q, k, v = self._heads(q, self.d_k), self._heads(k, self.d_k), self._heads(v, self.d_v)
            if cache is not None:
                k, v = cache.update(k, v)  # (B, h, T_cached + T_k, d)
        p = self.dropout if self.training else 0.0
        # query rows per memory row: the beams of a sentence share its memory (an empty batch: 1)
        n = q.size(0) // k.size(0) if k.size(0) else 1
        if n > 1:
            q = _grouped(q, k.size(0), n)  # (B, h, n·T_q, d_k): one attention per sentence
        out, weights = scaled_dot_product_attention(q, k, v, mask, p, need_weights)  # (B,h,T_q,d_v)
        if n > 1:
            out = _ungrouped(out, n)
            weights = None if weights is None else _ungrouped(weights, n)
        # Concat(head_1..h), its width spelled out: an empty batch or sequence cannot infer it
        out = out.transpose(1, 2).reshape(query.size(0), query.size(1), self.n_heads * self.d_v)
        return self.w_o(out), weights


def _grouped(q: Tensor, b: int, n: int) -> Tensor:
    """Queries of n consecutive rows per key row stacked along the query axis (the rows attend to the
    same keys with a key-only mask, so one product per key row serves them all).

    Shape: (B·n, h, T, d) -> (B, h, n·T, d)"""
    _, h, t, d = q.shape
    return q.view(b, n, h, t, d).transpose(1, 2).reshape(b, h, n * t, d)


def _ungrouped(x: Tensor, n: int) -> Tensor:
    """``_grouped``'s inverse. Shape: (B, h, n·T, d) -> (B·n, h, T, d)"""
    b, h, nt, d = x.shape
    return x.view(b, h, n, nt // n, d).transpose(1, 2).reshape(b * n, h, nt // n, d)
