"""Views of an encoded parallel corpus that training batches like the corpus itself.

- ``PairView(corpus, index, pseudo)``: the pairs at ``index`` (a jackknife half, ``halves``), each with
  the cached right-to-left translation of its source appended when ``pseudo`` is given: item i is
  then ``(src_ids, tgt_ids, pseudo_ids)`` and ``collate_translation`` fills ``TranslationBatch.r2l``.
- ``PseudoPairs(corpus, pseudo)``: each source with its cached right-to-left translation turned left
  to right as the target (empty translations left out): the distillation control's extra pairs.
- ``Concat(*views)``: several of these as one corpus.

Every view has ``.src.lengths`` and ``.tgt.lengths``, what ``TokenBatchSampler`` batches by (with a
cached translation, the target side's length is the longer of the target and the translation: the
right-to-left decoder reads the one, the left-to-right decoder the other, so a batch's token budget
holds both).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from aiayn.data.files import DataError


def jackknife_half(src_ids: Sequence[int]) -> int:
    """1 or 2: the half of the training pairs a source belongs to, by a CRC-32 of its ids, so that
    a source and its duplicates always fall in the same half (a duplicate in the other half would
    let a model translate a sentence it was trained on)."""
    return 1 + (zlib.crc32(np.asarray(src_ids, np.int64).tobytes()) & 1)


def halves(corpus) -> np.ndarray:
    """(N,) the ``jackknife_half`` of each pair's source."""
    return np.fromiter((jackknife_half(corpus.src[i]) for i in range(len(corpus))), np.int8, len(corpus))


class _Side:
    def __init__(self, lengths: np.ndarray):
        self.lengths = lengths


class PairView:
    """The pairs of ``corpus`` at ``index`` (all when None), with ``pseudo[j]`` appended to pair j."""

    def __init__(self, corpus, index: np.ndarray | None = None, pseudo=None):
        if pseudo is not None and len(pseudo) != len(corpus):
            raise DataError(f"{len(pseudo)} cached translations for {len(corpus)} pairs: the cache was made "
                            "from another corpus; delete it to rebuild")  # fmt: skip
        self.corpus, self.pseudo = corpus, pseudo
        self.index = np.arange(len(corpus)) if index is None else np.asarray(index, np.int64)
        if len(self.index) == 0:
            raise DataError("an empty view: no pair of the corpus is selected")
        self.src = _Side(corpus.src.lengths[self.index])
        tgt = corpus.tgt.lengths if pseudo is None else np.maximum(corpus.tgt.lengths, pseudo.lengths)
        self.tgt = _Side(tgt[self.index])  # a batch's budget holds the longer of target and translation

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple:
        j = int(self.index[i])
        return self.corpus[j] if self.pseudo is None else (*self.corpus[j], self.pseudo[j])


class PseudoPairs:
    """``(src_ids, reversed(pseudo_ids))``: each source with its right-to-left translation as a
    left-to-right target; sources whose translation is empty are left out."""

    def __init__(self, corpus, pseudo):
        if len(pseudo) != len(corpus):
            raise DataError(f"{len(pseudo)} cached translations for {len(corpus)} pairs: delete the cache")
        self.corpus, self.pseudo = corpus, pseudo
        self.index = np.flatnonzero(pseudo.lengths > 0)
        self.src = _Side(corpus.src.lengths[self.index])
        self.tgt = _Side(pseudo.lengths[self.index])

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple:
        j = int(self.index[i])
        return self.corpus.src[j], np.ascontiguousarray(self.pseudo[j][::-1])


class Concat:
    """Several views as one: item i of the first, then of the second, …"""

    def __init__(self, *parts):
        self.parts = parts
        self.starts = np.cumsum([0, *map(len, parts)])
        self.src = _Side(np.concatenate([p.src.lengths for p in parts]))
        self.tgt = _Side(np.concatenate([p.tgt.lengths for p in parts]))

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> tuple:
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.parts[k][i - int(self.starts[k])]
