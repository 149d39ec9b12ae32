"""Word dropout (``word_dropout``, task=classify): training texts lose pieces, validation keeps all."""

import numpy as np
import pytest

from aiayn.training.recipe import load_recipe
from aiayn.training.tasks.classify import drop_words
from aiayn.training.trainer import Trainer
from tests.training.test_encoder_tasks import TINY, rule_data  # noqa: F401 (a fixture)


def test_drop_words_keeps_an_ordered_share_and_at_least_one_piece():
    row = np.arange(100_000, dtype=np.int32)
    kept = drop_words(row, 0.25, np.random.default_rng(7))
    assert np.all(np.diff(kept) > 0)  # a subsequence, in order
    assert len(kept) / len(row) == pytest.approx(0.75, abs=0.01)
    expected = row[np.random.default_rng(7).random(len(row)) >= 0.25]  # the same draws, kept where ≥ p
    assert np.array_equal(kept, expected)
    rng = np.random.default_rng(0)
    assert all(len(drop_words(np.array([5, 6], np.int32), 0.99, rng)) >= 1 for _ in range(200))
    assert len(drop_words(np.array([], np.int32), 0.5, rng)) == 0


def _pieces(batch, pad):
    """Each row's pieces between bos and eos."""
    return [[i for i in row.tolist() if i != pad][1:-1] for row in batch.ids]


def _is_subsequence(short, long):
    it = iter(long)
    return all(any(x == y for y in it) for x in short)


def test_training_batches_leave_pieces_out_and_validation_reads_every_piece(rule_data, tmp_path):  # noqa: F811
    tasks = {}
    for p in (0.0, 0.4):
        args = ["task=classify", f"dataset={rule_data}", f"out_dir={tmp_path / str(p)}", f"word_dropout={p}"]
        tasks[p] = Trainer(load_recipe(None, [*args, *TINY])).task
    pad = tasks[0.0].special_ids["pad_id"]
    plain, dropped = tasks[0.0].train_batches(), tasks[0.4].train_batches()
    kept = total = 0
    for _ in range(5):
        a, b = next(plain), next(dropped)
        assert b.labels.tolist() == a.labels.tolist()  # the same texts in the same order
        for short, long in zip(_pieces(b, pad), _pieces(a, pad), strict=True):
            assert 1 <= len(short) <= len(long) and _is_subsequence(short, long)
            kept, total = kept + len(short), total + len(long)
    assert 0.5 < kept / total < 0.7  # 60% kept in expectation
    for a, b in zip(tasks[0.0].valid_batches(), tasks[0.4].valid_batches(), strict=True):
        assert a.ids.equal(b.ids) and a.labels.equal(b.labels)
