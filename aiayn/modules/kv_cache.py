"""Key/value caches for incremental (one token at a time) decoding.

In a decoder, self-attention keys and values of earlier positions do not change when a new token
arrives, and cross-attention keys and values depend only on the encoder memory. Caching them turns
each decoding step from O(T) layer passes into one. This module only stores tensors; the attention
module decides what to put in them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.masks import causal_mask


class KVCache:
    """Keys and values of one attention sublayer.

    ``static=False`` (self-attention): each ``update`` appends the new positions. They are written
    into a preallocated buffer (its length doubles when full), so a step copies only its own keys
    and values instead of the whole cache, as ``torch.cat`` would; ``k``/``v`` are views of the
    filled part. ``static=True`` (cross-attention): the first ``update`` stores the memory's keys
    and values, which later steps reuse without projecting the memory again.

    Buffers keep room for rows too: rows that join a running batch (``joined``) are written after
    the others in place, and rows that leave (``reorder``) leave their room free, so a server's
    batch that gains and loses a sentence at every step does not copy the whole cache once more
    for each arrival.

    Shape:
        k: (B, h, T, d_k), v: (B, h, T, d_v); buffers (≥ B rows, h, ≥ T positions, d)
    """

    def __init__(self, static: bool = False):
        self.static = static
        self._k: Tensor | None = None  # (row capacity, h, position capacity, d_k)
        self._v: Tensor | None = None
        self._len = 0  # positions filled (static: the memory's length)
        self._rows = 0  # rows in use

    @property
    def k(self) -> Tensor | None:
        return self._filled(self._k)

    @property
    def v(self) -> Tensor | None:
        return self._filled(self._v)

    def _filled(self, buf: Tensor | None) -> Tensor | None:
        if buf is None or (buf.size(0) == self._rows and buf.size(2) == self._len):
            return buf
        return buf[: self._rows, :, : self._len]

    def __len__(self) -> int:
        return self._len

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.static:  # stored contiguous (not as the heads' transposed view): every later step reads
            k, v = k.contiguous(), v.contiguous()  # them, and a product over a view copies it each time
        if self.static or self._k is None:
            self._k, self._v, self._len, self._rows = k, v, k.size(2), k.size(0)
            return k, v
        n, t = self._len, k.size(2)
        if n + t > self._k.size(2):  # full: a buffer twice as long (amortised O(1) copies per step)
            self._k, self._v = (_grown(x, self._rows, n, n + t) for x in (self._k, self._v))
        self._k[: self._rows, :, n : n + t] = k
        self._v[: self._rows, :, n : n + t] = v
        self._len = n + t
        return self.k, self.v

    def reorder(self, index: Tensor, first: int = 0) -> None:
        """Keep batch rows ``index`` (beam search: follow each surviving hypothesis's parent), and
        of an appending cache the positions from ``first`` on (earlier ones no row reads any more).

        Only the filled positions are copied, into a buffer of the same capacity."""
        if self._k is None:
            return
        if self.static and self._k.size(0) == self._rows:  # no room kept: exactly the memory's rows
            self._k, self._v = self._k[index], self._v[index]
        else:
            self._k, self._v = (_gathered(x, index, self._rows, self._len, first) for x in (self._k, self._v))
            self._len -= first
        self._rows = index.numel()

    def copy_rows(self, sources: Tensor, targets: Tensor) -> None:
        """Row ``targets[i]`` becomes a copy of row ``sources[i]`` (filled positions only), in place;
        no target may be a source."""
        if self._k is not None and targets.numel():
            for buf in (self._k, self._v):
                filled = buf[:, :, : self._len]
                filled[targets] = filled.index_select(0, sources)

    def joined(self, other: KVCache, length: int) -> KVCache:
        """This cache's rows then ``other``'s, in one cache: this one, grown in place when its
        buffers can hold both (use neither afterwards, only what this returns).

        Appending caches are aligned on their last position: each one's positions become the last
        of ``length`` (earlier ones hold zeros, which the rows' key masks hide). Static caches are
        padded with zeros to the longer memory (hidden by the memory's padding mask)."""
        if self._k is None and other._k is None:
            return KVCache(self.static)
        if self._k is None or len(other) > len(self):
            return self._rebuilt(other, length)
        a, b, n, m = self._rows, other._rows, len(self), len(other)
        if a + b > self._k.size(0):  # room for twice the rows: most joins then copy no old row
            self._k, self._v = (_with_rows(x, a, n, max(2 * x.size(0), a + b)) for x in (self._k, self._v))
        for buf, x in ((self._k, other.k), (self._v, other.v)):
            new = buf[a : a + b, :, :n]  # the joining rows, zero where they have nothing
            if self.static:  # the memory's positions first, then padding
                new[:, :, :m], new[:, :, m:] = x, 0
            else:  # right-aligned; the zeros are hidden by the key mask, but must be finite (0 · NaN)
                new[:, :, : n - m], new[:, :, n - m :] = 0, x
        self._rows = a + b
        return self

    def _rebuilt(self, other: KVCache, length: int) -> KVCache:
        """``joined`` into new buffers: for when ``other`` has more positions than this one, or this
        one is empty."""
        out = KVCache(self.static)
        if self.static:
            out._k, out._v = _padded_cat(self.k, other.k), _padded_cat(self.v, other.v)
        else:
            out._k, out._v = (_right_aligned(a, len(self), b, len(other), length)
                              for a, b in ((self.k, other.k), (self.v, other.v)))  # fmt: skip
        out._len, out._rows = (out._k.size(2) if self.static else length), out._k.size(0)
        return out


def _grown(buf: Tensor, rows: int, used: int, need: int) -> Tensor:
    """A buffer of ≥ ``need`` positions (twice the old length, or more) holding the first ``used``
    positions of ``buf``'s first ``rows`` rows."""
    new = buf.new_empty(*buf.shape[:2], max(2 * buf.size(2), need), buf.size(3))
    new[:rows, :, :used] = buf[:rows, :, :used]
    return new


def _with_rows(buf: Tensor, rows: int, used: int, capacity: int) -> Tensor:
    """A buffer of ``capacity`` rows holding the first ``used`` positions of ``buf``'s first ``rows``."""
    new = buf.new_empty(capacity, *buf.shape[1:])
    new[:rows, :, :used] = buf[:rows, :, :used]
    return new


class DecoderCache:
    """The caches of every layer of a decoder stack, plus the number of positions already decoded.

    ``layers[i]`` maps a sublayer name (``"self"``, ``"cross"``, ``"cross_r2l"``) to its ``KVCache``.

    Rows that started decoding at different steps share one cache (``join``, iteration-level
    batching): ``offsets[r]`` is the position in the cache where row r's first token lies. Its
    earlier positions are not its own (``key_mask`` hides them) and its next token's position in
    its sentence is ``len(self) - offsets[r]`` (``positions``). ``offsets`` is None while every
    row started together, which is the plain case and costs nothing.

    Shape:
        offsets: (N,) long or None
    """

    def __init__(self, n_layers: int):
        self.layers = [
            {"self": KVCache(), "cross": KVCache(static=True), "cross_r2l": KVCache(static=True)}
            for _ in range(n_layers)
        ]
        self.offsets: Tensor | None = None

    def positions(self) -> int | Tensor:
        """The position of each row's next token: one int while rows are aligned, else (N,)."""
        return len(self) if self.offsets is None else len(self) - self.offsets

    def key_mask(self, t: int, device: torch.device | None = None) -> Tensor | None:
        """Which cached and new positions each row's ``t`` new tokens may attend to (bool, True = may;
        causal among the new ones), or None while rows are aligned and ``t`` is 1 (all of them).

        Shape: returns (N, 1, t, len(self) + t), or (t, len(self) + t) while rows are aligned"""
        if self.offsets is None:
            return None if t == 1 else causal_mask(t, len(self) + t, device)
        keys = torch.arange(len(self) + t, device=self.offsets.device)
        own = keys[None, :] >= self.offsets[:, None]  # (N, L + t)
        return own[:, None, None, :] & causal_mask(t, len(self) + t, own.device)

    def join(self, other: DecoderCache) -> DecoderCache:
        """This cache's rows then ``other``'s, aligned on their last decoded position (see the class
        docstring); either may have decoded more positions than the other."""
        length = max(len(self), len(other))
        offsets = [_offsets(c, length) for c in (self, other)]
        out = DecoderCache(0)
        out.layers = [{name: a[name].joined(b[name], length) for name in a}
                      for a, b in zip(self.layers, other.layers, strict=True)]  # fmt: skip
        offsets = torch.cat(offsets)
        out.offsets = offsets if bool(offsets.any()) else None
        return out

    def __len__(self) -> int:
        """Positions decoded so far (the position of the next token)."""
        return len(self.layers[0]["self"]) if self.layers else 0

    def reorder_memory(self, index: Tensor) -> None:
        """Rows ``index`` of the cross-attention (static) caches only."""
        for layer in self.layers:
            for cache in layer.values():
                if cache.static:
                    cache.reorder(index)

    def fork(self, parents: Tensor) -> Tensor:
        """Rows that continue rows ``parents`` (beam search: each new hypothesis its parent's), found
        without reordering the cache: the first child of a row takes that row over, and every further
        child takes a row that no child continues, into which its parent's self-attention keys and
        values are copied. Returns each child's row; a beam step copies as many rows as it has
        children beyond the first of their parent, instead of every row.

        Children are listed sentence by sentence, each sentence's parents among its own rows (as in
        a beam search): the i-th extra child and the i-th unclaimed row, both in ascending order, are
        then in the same sentence, so a sentence keeps its rows (and its memory, its offset).

        Shape: parents (N,) rows of this cache -> (N,) rows, a permutation of 0 … N − 1"""
        n = parents.numel()
        order = torch.arange(n, device=parents.device)
        first = torch.full((n,), n, dtype=torch.long, device=parents.device)
        first.scatter_reduce_(0, parents, order, "amin")  # each row's first child (n: none)
        extra = (first[parents] != order).nonzero().squeeze(1)  # children after their parent's first
        if not extra.numel():
            return parents
        free = (first == n).nonzero().squeeze(1)  # rows no child continues
        for layer in self.layers:
            for cache in layer.values():
                if not cache.static:
                    cache.copy_rows(parents[extra], free)
        rows = parents.clone()
        rows[extra] = free
        return rows

    def reorder(self, index: Tensor, static: bool = True, memory_index: Tensor | None = None) -> None:
        """Keep batch rows ``index`` in every cache.

        ``static=False`` leaves the cross-attention caches as they are: right (and cheaper) when
        ``index[i]`` reads the same source as row ``i``, as when beams of one sentence are reordered.
        """
        first = 0
        if static and self.offsets is not None:  # rows leave: positions no row still reads go too
            self.offsets = self.offsets[index]
            first = int(self.offsets.min()) if self.offsets.numel() else 0
            self.offsets = self.offsets - first if bool((self.offsets > first).any()) else None
        for layer in self.layers:
            for cache in layer.values():
                if not cache.static:
                    cache.reorder(index, first)
                elif static:  # memory rows: one per sentence when its rows share it (``memory_index``)
                    cache.reorder(index if memory_index is None else memory_index)


def _offsets(cache: DecoderCache, length: int) -> Tensor:
    """The offsets of ``cache``'s rows once its positions are the last of ``length``."""
    slot = cache.layers[0]["self"]
    own = slot._k.new_zeros(slot._rows, dtype=torch.long) if cache.offsets is None else cache.offsets
    return own + (length - len(cache))


def _padded_cat(a: Tensor, b: Tensor) -> Tensor:
    """Rows of ``a`` then of ``b`` (B, h, S, d), the shorter padded with zeros along S."""
    s = max(a.size(2), b.size(2))
    return torch.cat([F.pad(x, (0, 0, 0, s - x.size(2))) for x in (a, b)])


def _right_aligned(a: Tensor, n_a: int, b: Tensor, n_b: int, length: int) -> Tensor:
    """One buffer of ``length`` positions (and room to grow) holding ``a``'s first ``n_a`` positions as
    its last ``n_a``, and likewise ``b``'s, rows of ``a`` first."""
    out = a.new_empty(a.size(0) + b.size(0), a.size(1), max(a.size(2), b.size(2), 2 * length), a.size(3))
    for rows, x, n in ((slice(0, a.size(0)), a, n_a), (slice(a.size(0), None), b, n_b)):
        out[rows, :, : length - n] = 0  # hidden by the key mask, but must be finite (0 · NaN is NaN)
        out[rows, :, length - n : length] = x[:, :, :n]
    return out


def _gathered(buf: Tensor, index: Tensor, rows: int, used: int, first: int = 0) -> Tensor:
    """Rows ``index`` (of the first ``rows``) of ``buf``'s positions ``first … used - 1``, moved to
    the start of a new buffer of ``buf``'s capacity (rows and positions)."""
    if buf.requires_grad:  # out= has no autograd: copy the whole buffer instead
        return buf[:rows].index_select(0, index)[:, :, first:]
    new = buf.new_empty(max(buf.size(0), index.numel()), *buf.shape[1:])
    torch.index_select(buf[:rows, :, first:used], 0, index, out=new[: index.numel(), :, : used - first])
    return new
