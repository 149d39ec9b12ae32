"""BERT's masking: the 15% / 80-10-10 split measured over many draws, specials never chosen,
whole words chosen together, masks that change with the seed."""

import numpy as np
import pytest
import torch

from aiayn.data import BOS_ID, EOS_ID, PAD_ID
from aiayn.data.masking import Masking, mask_tokens
from aiayn.errors import ConfigError

MASK, VOCAB = 4, 1000


def batch(rows=64, length=50, seed=0, padded=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (rows, length), generator=g)
    ids[:, 0], ids[:, -1] = BOS_ID, EOS_ID
    if padded:
        ids[: rows // 2, -10:] = PAD_ID  # half the rows padded
        ids[: rows // 2, -11] = EOS_ID
    return ids


def test_the_15_80_10_10_split_over_many_draws():
    ids = batch()
    real = (ids != PAD_ID) & (ids != BOS_ID) & (ids != EOS_ID)
    chosen = as_mask = as_random = kept = total = 0
    for k in range(200):
        inputs, targets = mask_tokens(ids, Masking(), MASK, VOCAB, np.random.default_rng(k))
        picked = targets != PAD_ID
        assert not (picked & ~real).any(), "a special or padding was chosen"
        assert torch.equal(targets[picked], ids[picked]), "targets are the original tokens"
        assert torch.equal(inputs[~picked], ids[~picked]), "unchosen positions are untouched"
        chosen += int(picked.sum())
        as_mask += int((inputs[picked] == MASK).sum())
        changed = picked & (inputs != MASK) & (inputs != ids)
        as_random += int(changed.sum())
        kept += int((picked & (inputs == ids)).sum())
        total += int(real.sum())
    # ≈ 500k draws: 4 standard deviations is below 0.2 percentage points
    assert chosen / total == pytest.approx(0.15, abs=0.002)
    assert as_mask / chosen == pytest.approx(0.8, abs=0.005)
    # a random token equal to the original counts as kept: expected 0.1 · (1 − 1/995)
    assert as_random / chosen == pytest.approx(0.1 * (1 - 1 / 995), abs=0.004)
    assert kept / chosen == pytest.approx(0.1 + 0.1 / 995, abs=0.004)


def test_random_replacements_are_ordinary_tokens_and_masks_follow_the_seed():
    ids = batch()
    masking = Masking(p=0.5, p_mask=0.0, p_random=1.0)
    inputs, targets = mask_tokens(ids, masking, MASK, VOCAB, np.random.default_rng(0))
    assert inputs[targets != PAD_ID].min() >= 5  # never a special or <mask>
    again, _ = mask_tokens(ids, masking, MASK, VOCAB, np.random.default_rng(0))
    other, _ = mask_tokens(ids, masking, MASK, VOCAB, np.random.default_rng(1))
    assert torch.equal(inputs, again) and not torch.equal(inputs, other)


def test_every_sequence_predicts_something():
    ids = batch(rows=200, length=6, padded=False)  # 4 real tokens: P(none chosen) = 0.85^4 ≈ 52%
    _, targets = mask_tokens(ids, Masking(), MASK, VOCAB, np.random.default_rng(0))
    assert ((targets != PAD_ID).sum(1) >= 1).all()


def test_whole_words_are_chosen_together():
    starts = torch.zeros(VOCAB, dtype=torch.bool)
    starts[: VOCAB // 2] = True  # ids < 500 begin a word, ids ≥ 500 continue one
    starts[:5] = True
    ids = batch(length=40)
    for k in range(20):
        _, targets = mask_tokens(ids, Masking(whole_word=True), MASK, VOCAB, np.random.default_rng(k), starts)
        picked = targets != PAD_ID
        for row, pick in zip(ids.tolist(), picked.tolist(), strict=True):
            word, words, previous = -1, {}, BOS_ID
            for tok, p in zip(row, pick, strict=True):
                special = tok in (BOS_ID, EOS_ID, PAD_ID)
                word += bool(starts[tok]) or special or previous in (BOS_ID, EOS_ID, PAD_ID)
                previous = tok
                if not special:
                    words.setdefault(word, set()).add(p)
            assert all(len(v) == 1 for v in words.values()), "a word was split between chosen and not"


@pytest.mark.parametrize("kwargs", [dict(p=0.0), dict(p=1.5), dict(p_mask=0.9, p_random=0.2)])
def test_bad_masking_is_a_config_error(kwargs):
    with pytest.raises(ConfigError):
        Masking(**kwargs)
