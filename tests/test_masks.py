"""The one mask convention: bool, True = may attend, combined with &."""

import pytest
import torch

from aiayn.masks import causal_mask, padding_mask, window_mask


def test_padding_mask_marks_real_tokens():
    ids = torch.tensor([[5, 6, 0], [0, 0, 0]])
    m = padding_mask(ids, pad_id=0)
    assert m.dtype == torch.bool and m.shape == (2, 1, 1, 3)
    assert m[0, 0, 0].tolist() == [True, True, False] and not m[1].any()


def test_causal_mask_is_lower_triangular_and_offsets_for_caches():
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # two new queries at positions 3, 4 of a 5-long sequence
    assert causal_mask(2, 5).tolist() == [[True] * 4 + [False], [True] * 5]


def test_masks_combine_with_and_not_or():
    """Tutorial pitfall: padding | causal lets a position see the future (or padding)."""
    ids = torch.tensor([[4, 5, 6, 0]])
    combined = padding_mask(ids, 0) & causal_mask(4)  # (1, 1, 4, 4)
    expected = [[j <= i and ids[0, j] != 0 for j in range(4)] for i in range(4)]
    assert combined[0, 0].tolist() == expected
    assert (padding_mask(ids, 0) | causal_mask(4))[0, 0].tolist() != expected


def test_window_mask_is_a_band_of_width_two_windows_plus_one():
    t, f = True, False
    assert window_mask(5, 1).tolist() == [[t, t, f, f, f], [t, t, t, f, f], [f, t, t, t, f],
                                          [f, f, t, t, t], [f, f, f, t, t]]  # fmt: skip
    assert window_mask(3, 2).all() and window_mask(4, 2).sum() == 4 * 4 - 2
    with pytest.raises(ValueError, match="window=0"):
        window_mask(3, 0)
