"""Key/value caches for incremental (one token at a time) decoding.

In a decoder, self-attention keys and values of earlier positions do not change when a new token
arrives, and cross-attention keys and values depend only on the encoder memory. Caching them turns
each decoding step from O(T) layer passes into one. This module only stores tensors; the attention
module decides what to put in them.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values of one attention sublayer.

    ``static=False`` (self-attention): each ``update`` appends the new positions.
    ``static=True`` (cross-attention): the first ``update`` stores the memory's keys and values,
    which later steps reuse without projecting the memory again.

    Shape:
        k: (B, h, T, d_k), v: (B, h, T, d_v)
    """

    def __init__(self, static: bool = False):
        self.static = static
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.k is None or self.static:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=2)
            self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: follow each surviving hypothesis's parent)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class DecoderCache:
    """The caches of every layer of a decoder stack, plus the number of positions already decoded.

    ``layers[i]`` maps a sublayer name (``"self"``, ``"cross"``, ``"cross_r2l"``) to its ``KVCache``.
    """

    def __init__(self, n_layers: int):
        self.layers = [
            {"self": KVCache(), "cross": KVCache(static=True), "cross_r2l": KVCache(static=True)}
            for _ in range(n_layers)
        ]

    def __len__(self) -> int:
        """Positions decoded so far (the position of the next token)."""
        return len(self.layers[0]["self"]) if self.layers else 0

    def reorder(self, index: Tensor, static: bool = True) -> None:
        """Keep batch rows ``index`` in every cache.

        ``static=False`` leaves the cross-attention caches as they are: right (and cheaper) when
        ``index[i]`` reads the same source as row ``i``, as when beams of one sentence are reordered.
        """
        for layer in self.layers:
            for cache in layer.values():
                if static or not cache.static:
                    cache.reorder(index)
