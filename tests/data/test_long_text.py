"""Long texts for a classifier: head, tail and head+tail keep their documented counts, windows
cover every piece, and pooling is the mean of the windows' logits (by hand)."""

import numpy as np
import pytest
import torch

from aiayn.data.long_text import LongText, pool_windows
from aiayn.errors import ConfigError

MAX_LEN = 12  # n = 10 pieces between bos and eos


@pytest.mark.parametrize("length", [1, 10, 11, 23, 40])
@pytest.mark.parametrize("stride", [0, 1, 3, 10])
def test_windows_cover_every_piece_and_start_every_stride(length, stride):
    ids = np.arange(length)
    windows = LongText("windows", stride).pieces(ids, MAX_LEN)
    assert all(1 <= len(w) <= MAX_LEN - 2 for w in windows)
    covered = np.concatenate(windows)
    assert set(covered.tolist()) == set(range(length))  # every piece read at least once
    step = stride or (MAX_LEN - 2) // 2
    starts = [int(w[0]) for w in windows]
    assert starts == list(range(0, step * len(windows), step))
    assert windows[-1][-1] == length - 1 and (len(windows) == 1 or starts[-2] + MAX_LEN - 2 < length)


def test_the_default_stride_is_half_a_window():
    windows = LongText("windows").pieces(np.arange(23), MAX_LEN)
    assert [w.tolist() for w in windows] == [list(range(0, 10)), list(range(5, 15)), list(range(10, 20)),
                                             list(range(15, 23))]  # fmt: skip


def test_head_tail_and_head_plus_tail_keep_their_counts():
    ids = np.arange(100)
    (head,) = LongText("head").pieces(ids, MAX_LEN)
    (tail,) = LongText("tail").pieces(ids, MAX_LEN)
    (both,) = LongText("head+tail").pieces(ids, MAX_LEN)
    assert head.tolist() == list(range(10)) and tail.tolist() == list(range(90, 100))
    assert both.tolist() == [0, 1, 2] + list(range(93, 100))  # max_len // 4 = 3 first, 7 last
    (paper,) = LongText("head+tail").pieces(np.arange(1000), 512)
    assert paper.tolist() == list(range(128)) + list(range(1000 - 382, 1000))  # Sun et al.: 128 + 382
    for how in ("head", "tail", "head+tail", "windows"):  # a text that fits is read whole
        assert [r.tolist() for r in LongText(how).pieces(np.arange(7), MAX_LEN)] == [list(range(7))]


def test_rows_and_pooling_by_hand():
    texts = [np.arange(4), np.arange(23), np.arange(11)]
    rows, owner = LongText("windows").rows(texts, MAX_LEN)
    assert owner.tolist() == [0, 1, 1, 1, 1, 2, 2]
    logits = torch.randn(len(rows), 3, generator=torch.Generator().manual_seed(0))
    pooled = pool_windows(logits, torch.from_numpy(owner), len(texts))
    by_hand = torch.stack([logits[0], (logits[1] + logits[2] + logits[3] + logits[4]) / 4,
                           (logits[5] + logits[6]) / 2])  # fmt: skip
    torch.testing.assert_close(pooled, by_hand)
    one_row = LongText("head").rows(texts, MAX_LEN)[1]
    assert one_row.tolist() == [0, 1, 2]
    torch.testing.assert_close(pool_windows(logits[:3], torch.from_numpy(one_row), 3), logits[:3])


def test_bad_policies_say_what_to_do():
    with pytest.raises(ConfigError, match=r"long_text='middle' is not one of"):
        LongText("middle")
    with pytest.raises(ConfigError, match=r"window_stride=-1 must be an integer ≥ 0"):
        LongText("windows", -1)
    with pytest.raises(ConfigError, match=r"window_stride=11 is over a window's max_len - 2 = 10 pieces"):
        LongText("windows", 11).pieces(np.arange(30), MAX_LEN)
