"""Views of an encoded corpus (``aiayn/data/views.py``): halves, cached translations, concatenation."""

import numpy as np
import pytest

from aiayn.data.cache import Ragged
from aiayn.data.files import DataError
from aiayn.data.views import Concat, PairView, PseudoPairs, halves, jackknife_half


class Pairs:
    def __init__(self, src, tgt):
        self.src, self.tgt = (Ragged(np.concatenate(r).astype(np.uint16), np.cumsum([0, *map(len, r)]))
                              for r in (src, tgt))  # fmt: skip

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        return self.src[i], self.tgt[i]


def ragged(rows):
    return Ragged(np.array([t for r in rows for t in r], np.uint16), np.cumsum([0, *map(len, rows)]))


CORPUS = Pairs([[5, 6], [7], [5, 6], [8, 9, 10], [11]], [[20], [21, 22], [23], [24], [25, 26, 27]])
PSEUDO = ragged([[30, 31], [], [32], [33, 34, 35], [36]])


def test_halves_follow_the_source_so_duplicates_share_one():
    h = halves(CORPUS)
    assert set(h.tolist()) <= {1, 2} and h[0] == h[2]  # pairs 0 and 2 share the source [5, 6]
    assert jackknife_half([5, 6]) == h[0] and jackknife_half(np.array([5, 6], np.uint16)) == h[0]
    counts = np.bincount([jackknife_half([i, i + 1]) for i in range(2000)])
    assert abs(counts[1] - counts[2]) < 150, "the halves are far from even"


def test_a_view_selects_pairs_and_appends_their_translations():
    view = PairView(CORPUS, np.array([3, 1]), PSEUDO)
    assert len(view) == 2 and view.src.lengths.tolist() == [3, 1]
    assert view.tgt.lengths.tolist() == [3, 2]  # the longer of target and translation: [1 vs 3], [2 vs 0]
    assert PairView(CORPUS, np.array([3, 1])).tgt.lengths.tolist() == [1, 2]
    assert [x.tolist() for x in view[0]] == [[8, 9, 10], [24], [33, 34, 35]]
    assert [x.tolist() for x in PairView(CORPUS)[1]] == [[7], [21, 22]]
    with pytest.raises(DataError, match="4 cached translations for 5 pairs"):
        PairView(CORPUS, None, ragged([[1]] * 4))


def test_pseudo_pairs_turn_the_translation_left_to_right_and_concat_joins():
    extra = PseudoPairs(CORPUS, PSEUDO)
    assert len(extra) == 4  # the empty translation is left out
    assert [x.tolist() for x in extra[0]] == [[5, 6], [31, 30]]
    assert extra.tgt.lengths.tolist() == [2, 1, 3, 1]
    both = Concat(PairView(CORPUS), extra)
    assert len(both) == 9 and both.src.lengths.tolist() == [2, 1, 2, 3, 1, 2, 2, 3, 1]
    assert [x.tolist() for x in both[4]] == [[11], [25, 26, 27]]
    assert [x.tolist() for x in both[5]] == [[5, 6], [31, 30]] and [x.tolist() for x in both[8]] == [
        [11],
        [36],
    ]
