"""ELECTRA's corruption with a fixed generator: the positions are exactly masked-LM's choice, the
samples follow the generator's frequencies (counted by hand), and every real position is labelled
by whether its token changed."""

import numpy as np
import pytest
import torch

from aiayn.data import BOS_ID, EOS_ID, PAD_ID
from aiayn.data.masking import Masking, mask_tokens
from aiayn.data.replacing import NOT_SCORED, piece_distribution, replace_tokens
from aiayn.errors import ConfigError
from tests.data.test_masking import VOCAB, batch


def test_the_unigram_generator_is_the_streams_piece_counts():
    stream = np.array([5, 6, 6, 2, 7, 7, 7, 2, 1, 0])  # specials (ids < 5) never sampled
    probs = piece_distribution(stream, 9, "unigram")
    assert probs.tolist() == pytest.approx([0, 0, 0, 0, 0, 1 / 6, 2 / 6, 3 / 6, 0])
    assert piece_distribution(stream, 8, "uniform").tolist() == pytest.approx([0] * 5 + [1 / 3] * 3)
    with pytest.raises(ConfigError, match=r"generator 'bert' is not one of \('unigram', 'uniform'\)"):
        piece_distribution(stream, 9, "bert")
    with pytest.raises(ConfigError, match="no ordinary piece"):
        piece_distribution(np.array([1, 2, 0]), 9, "unigram")


def test_the_replaced_positions_are_masked_lms_choice_and_labels_say_what_changed():
    ids = batch()
    never = np.zeros(VOCAB)
    never[VOCAB - 1] = 1.0  # one piece that batch() never draws: every chosen position changes
    ids[ids == VOCAB - 1] = VOCAB - 2
    for whole_word, starts in ((False, None), (True, torch.rand(VOCAB) < 0.5)):
        inputs, labels = replace_tokens(ids, 0.15, never, np.random.default_rng(3), starts)
        _, targets = mask_tokens(
            ids, Masking(0.15, 0, 0, whole_word), 0, VOCAB, np.random.default_rng(3), starts
        )
        chosen = targets != PAD_ID
        assert torch.equal(inputs != ids, chosen) and (inputs[chosen] == VOCAB - 1).all()
        real = (ids != PAD_ID) & (ids != BOS_ID) & (ids != EOS_ID)
        assert torch.equal(labels == NOT_SCORED, ~real)
        assert torch.equal(labels[real], chosen[real].long())


def test_samples_follow_the_generator_and_a_drawn_original_counts_as_original():
    ids = batch(rows=32, length=40, padded=False)
    ids[:, 1:-1] = 7  # every real token is piece 7 ...
    probs = np.zeros(VOCAB)
    probs[[7, 8, 9]] = [0.5, 0.3, 0.2]  # ... which the generator draws half the time
    drawn = []
    changed = chosen = 0
    for k in range(100):
        inputs, labels = replace_tokens(ids, 0.2, probs, np.random.default_rng(k))
        _, targets = mask_tokens(ids, Masking(0.2, 0, 0), 0, VOCAB, np.random.default_rng(k))
        picked = targets != PAD_ID
        drawn.append(inputs[picked])
        chosen += int(picked.sum())
        changed += int((labels == 1).sum())
        assert torch.equal(labels == 1, inputs != ids)
    counts = torch.bincount(torch.cat(drawn), minlength=VOCAB)[[7, 8, 9]].double() / chosen
    assert counts.tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.02)
    assert changed / chosen == pytest.approx(0.5, abs=0.02)


def test_the_draws_follow_the_seed():
    ids, probs = batch(), piece_distribution(np.arange(5, VOCAB), VOCAB, "unigram")
    a = replace_tokens(ids, 0.15, probs, np.random.default_rng(1))
    b = replace_tokens(ids, 0.15, probs, np.random.default_rng(1))
    c = replace_tokens(ids, 0.15, probs, np.random.default_rng(2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
