"""Attention masks, with one convention for the whole package.

**Mask convention.** A mask is a boolean tensor broadcastable to the attention scores
``(B, h, T_q, T_k)``; ``True`` means *this query may attend to this key*. This is the convention of
``torch.nn.functional.scaled_dot_product_attention``. Masks combine with ``&`` (a key must be allowed
by every mask). ``torch.nn.MultiheadAttention`` uses the opposite convention (``True`` = blocked):
convert at that boundary with ``~mask``. A query row with nothing to attend to yields a zero output
(see ``aiayn.modules.attention``), never NaN.

This module only builds masks; it does not apply them.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens (not padding) may be attended to.

    Shape:
        ids: (B, S) token ids
        returns: (B, 1, 1, S) bool, broadcasts over heads and queries
    """
    return (ids != pad_id)[:, None, None, :]


def causal_mask(t_q: int, t_k: int | None = None, device: torch.device | None = None) -> Tensor:
    """The look-ahead mask: query i may attend to keys 0..i (and not to later positions).

    With ``t_k > t_q`` the queries are the *last* ``t_q`` positions of a length-``t_k`` sequence,
    as in incremental decoding where earlier keys come from a cache: query i sits at position
    ``t_k - t_q + i``.

    Shape:
        returns: (t_q, t_k) bool, lower-triangular; broadcasts to (B, h, t_q, t_k)
    """
    t_k = t_q if t_k is None else t_k
    if t_k < t_q:
        raise ValueError(f"causal_mask: t_k={t_k} must be >= t_q={t_q}")
    ones = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    return ones.tril(diagonal=t_k - t_q)


def window_mask(t: int, window: int, device: torch.device | None = None) -> Tensor:
    """A local window: query i may attend to keys i − window … i + window only, so that a layer sees
    what a convolution of width 2·window + 1 sees, and a stack of L layers L·window positions each way.

    Shape:
        returns: (t, t) bool, a band around the diagonal; broadcasts to (B, h, t, t)
    """
    if window < 1:
        raise ValueError(f"window_mask: window={window} must be ≥ 1")
    pos = torch.arange(t, device=device)
    return (pos[:, None] - pos[None, :]).abs() <= window
