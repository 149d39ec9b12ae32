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

    ``static=False`` (self-attention): each ``update`` appends the new positions. They are written
    into a preallocated buffer (its length doubles when full), so a step copies only its own keys
    and values instead of the whole cache, as ``torch.cat`` would; ``k``/``v`` are views of the
    filled part. ``static=True`` (cross-attention): the first ``update`` stores the memory's keys
    and values, which later steps reuse without projecting the memory again.

    Shape:
        k: (B, h, T, d_k), v: (B, h, T, d_v)
    """

    def __init__(self, static: bool = False):
        self.static = static
        self._k: Tensor | None = None  # (B, h, capacity, d_k); static: exactly the memory's
        self._v: Tensor | None = None
        self._len = 0

    @property
    def k(self) -> Tensor | None:
        return self._k if self._k is None or self.static else self._k[:, :, : self._len]

    @property
    def v(self) -> Tensor | None:
        return self._v if self._v is None or self.static else self._v[:, :, : self._len]

    def __len__(self) -> int:
        return self._len

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.static or self._k is None:
            self._k, self._v, self._len = k, v, k.size(2)
            return k, v
        n, t = self._len, k.size(2)
        if n + t > self._k.size(2):  # full: a buffer twice as long (amortised O(1) copies per step)
            self._k, self._v = _grown(self._k, n, n + t), _grown(self._v, n, n + t)
        self._k[:, :, n : n + t] = k
        self._v[:, :, n : n + t] = v
        self._len = n + t
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: follow each surviving hypothesis's parent).

        Only the filled positions are copied, into a buffer of the same capacity."""
        if self._k is not None:
            self._k, self._v = _gathered(self._k, index, self._len), _gathered(self._v, index, self._len)


def _grown(buf: Tensor, used: int, need: int) -> Tensor:
    """A buffer of ≥ ``need`` positions (twice the old length, or more) holding ``buf``'s first ``used``."""
    new = buf.new_empty(*buf.shape[:2], max(2 * buf.size(2), need), buf.size(3))
    new[:, :, :used] = buf[:, :, :used]
    return new


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


def _gathered(buf: Tensor, index: Tensor, used: int) -> Tensor:
    """Rows ``index`` of ``buf``'s first ``used`` positions, in a new buffer of ``buf``'s capacity."""
    if buf.requires_grad:  # out= has no autograd: copy the whole buffer instead
        return buf.index_select(0, index)
    new = buf.new_empty(index.numel(), *buf.shape[1:])
    torch.index_select(buf[:, :, :used], 0, index, out=new[:, :, :used])
    return new
