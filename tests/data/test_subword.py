"""Subword regularisation (BPE-dropout): every sampled segmentation decodes to its text, a seed
fixes it, p → 1 leaves characters (Provilkov et al. 2020), and re-segmented epochs resume and
shard exactly as ``TokenBatchSampler``'s."""

import numpy as np
import pytest

from aiayn.data import CorpusFilter, SentencePieceTokenizer, load_parallel
from aiayn.data.subword import ResegmentedEpochs, Resegmenter
from aiayn.errors import ModelDirError


@pytest.fixture(scope="module")
def pairs():
    return list(load_parallel("multi30k", "valid"))  # 1,014 pairs


@pytest.fixture(scope="module")
def tok(pairs):
    return SentencePieceTokenizer.train((s for pair in pairs for s in pair), 1000)


def test_a_sampled_segmentation_decodes_to_its_text_and_a_seed_fixes_it(tok, pairs):
    texts = [de for de, _ in pairs]
    plain = tok.encode_batch(texts)
    first, again, other = (tok.sample_batch(texts, 0.1, seed) for seed in (7, 7, 8))
    assert first == again and first != other
    assert [tok.decode(ids) for ids in first] == texts  # another split of the same text
    changed = sum(a != b for a, b in zip(first, plain)) / len(texts)
    assert 0.5 < changed < 1  # p = 0.1 per merge: most sentences of ~12 words change somewhere
    assert sum(map(len, first)) > 1.1 * sum(map(len, plain))  # dropped merges mean more pieces
    assert tok.sample_batch(texts, 0.0, 7) == plain


def test_dropping_almost_every_merge_leaves_characters(tok, pairs):
    texts = [de for de, _ in pairs[:50]]
    pieces = [tok.sp.id_to_piece(i) for ids in tok.sample_batch(texts, 0.999, 1) for i in ids]
    single = sum(len(p.lstrip("\u2581")) <= 1 for p in pieces) / len(pieces)
    assert single > 0.98 and len(pieces) > 0.9 * sum(len(t) for t in texts)


def test_a_sampled_corpus_is_filtered_on_its_sampled_lengths(tok, pairs):
    data = Resegmenter(pairs, tok, tok, 0.1, CorpusFilter(max_len=30)).sample([1, 0])
    lengths = np.maximum(data.src.lengths, data.tgt.lengths)
    assert data.stats.total == len(pairs) and data.stats.kept == len(data) and data.stats.too_long > 0
    assert lengths.max() <= 30
    src, tgt = data[0]
    assert src.dtype == np.int64 and tok.decode(tgt.tolist()) in {t for _, t in pairs}


def _epochs(tok, pairs, **kw):
    return ResegmentedEpochs(Resegmenter(pairs, tok, tok, 0.1, CorpusFilter()), 600, seed=3, **kw)


def _key(batch):
    return [tuple(map(tuple, pair)) for pair in batch]


def test_epochs_differ_and_resume_exactly(tok, pairs):
    epochs = _epochs(tok, pairs)
    first = [_key(b) for b in epochs]
    second = [_key(b) for b in epochs]
    assert {p for b in first for p in b} != {p for b in second for p in b}  # a new segmentation
    assert all(sum(max(len(s), len(t)) + 1 for s, t in b) <= 600 * len(b) for b in first)
    resumed = _epochs(tok, pairs)
    stopped = _epochs(tok, pairs)
    it = iter(stopped)
    head = [_key(next(it)) for _ in range(5)]
    resumed.load_state_dict(stopped.state_dict())
    assert head + [_key(b) for b in resumed] == first
    assert [_key(b) for b in resumed] == second


def test_ranks_share_each_epoch_and_take_disjoint_batches(tok, pairs):
    ranks = [_epochs(tok, pairs, rank=r, world_size=2) for r in (0, 1)]
    batches = [[_key(b) for b in r] for r in ranks]
    assert len(batches[0]) == len(batches[1]) > 0
    assert not {p for b in batches[0] for p in b} & {p for b in batches[1] for p in b}


def test_a_position_past_the_epoch_is_refused(tok, pairs):
    epochs = _epochs(tok, pairs)
    with pytest.raises(ModelDirError, match="cannot resume"):
        epochs.load_state_dict({"epoch": 1, "position": 10_000})
    with pytest.raises(ModelDirError, match="corrupt"):
        epochs.load_state_dict({"epoch": "x"})


def test_one_side_only_keeps_the_other_deterministic(tok, pairs):
    plain = Resegmenter(pairs, tok, tok, 0.1, CorpusFilter()).sample(0)  # both sides sampled
    src_only = Resegmenter(pairs, tok, tok, 0.1, CorpusFilter(), "source").sample(0)
    tgt_only = Resegmenter(pairs, tok, tok, 0.1, CorpusFilter(), "target").sample(0)
    for data, fixed, sampled in ((src_only, "tgt", "src"), (tgt_only, "src", "tgt")):
        side = 1 if fixed == "tgt" else 0
        assert [getattr(data, fixed)[i].tolist() for i in range(len(data))] == tok.encode_batch(
            [p[side] for p in pairs]
        )
        assert [getattr(data, sampled)[i].tolist() for i in range(10)] == [
            getattr(plain, sampled)[i].tolist() for i in range(10)
        ]  # the same seed draws the same sample for the sampled side
    with pytest.raises(ValueError, match="sides='neither'"):
        Resegmenter(pairs, tok, tok, 0.1, CorpusFilter(), "neither")
