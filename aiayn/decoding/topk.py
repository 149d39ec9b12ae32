"""``topk`` over the last dimension, exact, and faster than ``torch.topk`` on long CPU rows.

On CPU, ``torch.topk`` and ``torch.argmax`` over a vocabulary-sized row run a scalar loop, while
``amax`` (no indices) is vectorised (docs/results.md has the timings). So we cut each row into
blocks of ``BLOCK`` columns, take every block's maximum, and run the exact top-k on the k blocks
with the largest maxima only. This is exact: a block outside those k has k blocks whose maxima
are at least its own maximum, so none of its entries is among the k largest (up to the order of
tied values).
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 128


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest values of each row, largest first, and their column indices.

    Shape:
        x: (N, V) -> values (N, k), indices (N, k)
    """
    n, v = x.shape
    n_blocks = v // BLOCK
    if x.device.type != "cpu" or n_blocks <= 2 * k:  # short rows: nothing to gain
        return x.topk(k, dim=-1)
    maxima = x[:, : n_blocks * BLOCK].view(n, n_blocks, BLOCK).amax(dim=-1)  # (N, n_blocks)
    best = maxima.topk(k, dim=-1).indices  # (N, k)
    cols = (best[:, :, None] * BLOCK + torch.arange(BLOCK, device=x.device)).view(n, k * BLOCK)
    if n_blocks * BLOCK < v:  # the columns after the last whole block are always candidates
        cols = torch.cat([cols, torch.arange(n_blocks * BLOCK, v, device=x.device).expand(n, -1)], dim=1)
    values, j = x.gather(1, cols).topk(k, dim=-1)
    return values, cols.gather(1, j)
