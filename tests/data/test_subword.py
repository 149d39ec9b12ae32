"""Subword regularisation (BPE-dropout): every sampled segmentation decodes to its text, a seed
fixes it, p → 1 leaves characters (Provilkov et al. 2020), and re-segmented epochs resume and
shard exactly as ``TokenBatchSampler``'s."""

import numpy as np
import pytest

from aiayn.data import CorpusFilter, SentencePieceTokenizer, load_parallel
from aiayn.data.batching import CorpusEpochs
from aiayn.data.subword import (
    Resegmenter,
    SampledParallel,
    pairs_report,
    report,
    segmentations,
    split_otherwise,
    to_ragged,
)
from aiayn.errors import DataError, ModelDirError


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
    assert src.dtype == np.int32 and tok.decode(tgt.tolist()) in {t for _, t in pairs}


@pytest.fixture(scope="module")
def samples(tok, pairs):
    reseg = Resegmenter(pairs, tok, tok, 0.1, CorpusFilter())
    return [reseg.sample([3, k]) for k in range(3)]


def _epochs(samples, **kw):
    return CorpusEpochs(samples, 600, seed=3, **kw)


def _key(batch):
    return [tuple(map(tuple, pair)) for pair in batch]


def test_epochs_differ_and_resume_exactly(samples):
    epochs = _epochs(samples)
    first = [_key(b) for b in epochs]
    second = [_key(b) for b in epochs]
    assert {p for b in first for p in b} != {p for b in second for p in b}  # a new segmentation
    assert all(len(b) * max(max(len(s), len(t)) + 1 for s, t in b) <= 600 for b in first)  # padded budget
    resumed = _epochs(samples)
    stopped = _epochs(samples)
    it = iter(stopped)
    head = [_key(next(it)) for _ in range(5)]
    resumed.load_state_dict(stopped.state_dict())
    assert head + [_key(b) for b in resumed] == first
    assert [_key(b) for b in resumed] == second


def test_ranks_share_each_epoch_and_take_disjoint_batches(samples):
    ranks = [_epochs(samples, rank=r, world_size=2) for r in (0, 1)]
    batches = [[_key(b) for b in r] for r in ranks]
    assert len(batches[0]) == len(batches[1]) > 0
    assert not {p for b in batches[0] for p in b} & {p for b in batches[1] for p in b}
    one = _epochs(samples)  # the same segmentation, its batches dealt out in turn
    every = [_key([one.data(0)[0][i] for i in idx]) for idx in one.data(0)[1].global_batches(0)]
    kept = every[: len(every) - len(every) % 2]
    assert batches[0] == kept[0::2] and batches[1] == kept[1::2]


def test_a_used_up_epoch_resumes_at_the_next_one(samples):
    epochs = _epochs(samples)
    first = [_key(b) for b in epochs]
    assert epochs.state_dict() == {"epoch": 1, "position": 0}
    resumed = _epochs(samples)
    resumed.load_state_dict({"epoch": 1, "position": 0})
    second = [_key(b) for b in resumed]
    fresh = _epochs(samples)
    assert [_key(b) for b in fresh] == first and [_key(b) for b in fresh] == second


def test_samples_are_drawn_once_and_read_back_by_every_later_caller(tok, pairs, tmp_path, monkeypatch):
    """sentencepiece does not repeat a seeded sample in another process, so ranks and resumed runs
    read the samples rank 0 saved; a second call must load them, not draw again."""
    reseg = Resegmenter(pairs, tok, tok, 0.1, CorpusFilter())
    first = segmentations(reseg, tmp_path / "subword", seed=1, n=2)
    assert sorted(p.name for p in (tmp_path / "subword").iterdir()) == [
        "segmentation-0.npz",
        "segmentation-1.npz",
    ]
    monkeypatch.setattr(Resegmenter, "sample", lambda *a: pytest.fail("drew a sample that was saved"))
    again = segmentations(reseg, tmp_path / "subword", seed=1, n=2)
    for a, b in zip(first, again):
        assert np.array_equal(a.src.ids, b.src.ids) and np.array_equal(a.tgt.offsets, b.tgt.offsets)
    assert first[0].src.ids.tolist() != first[1].src.ids.tolist()  # two different samples
    (tmp_path / "subword" / "segmentation-1.npz").write_bytes(b"PK\x03\x04 torn")
    with pytest.raises(DataError, match="segmentation-1.npz: not a saved segmentation"):
        segmentations(reseg, tmp_path / "subword", seed=1, n=2)


def test_a_position_past_the_epoch_is_refused(samples):
    epochs = _epochs(samples)
    with pytest.raises(ModelDirError, match="cannot resume"):
        epochs.load_state_dict({"epoch": 1, "position": 10_000})
    with pytest.raises(ModelDirError, match="corrupt"):
        epochs.load_state_dict({"epoch": "x"})


def test_one_side_only_keeps_the_other_deterministic(tok, pairs):
    plain = Resegmenter(pairs, tok, tok, 0.1, CorpusFilter()).sample(0)  # both sides sampled
    src_only = Resegmenter(pairs, tok, tok, 0.1, CorpusFilter(), "source").sample(0)
    tgt_only = Resegmenter(pairs, tok, tok, 0.1, CorpusFilter(), "target").sample(0)
    assert plain.stats.kept == src_only.stats.kept == tgt_only.stats.kept == len(pairs)  # aligned indices
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


def test_split_otherwise_compares_each_text_piece_by_piece():
    a = to_ragged([[1, 2, 3], [4, 5], [], [6], [7, 8]])
    b = to_ragged([[1, 2, 3], [4, 9], [], [6, 6], [8, 7]])
    assert split_otherwise(a, b).tolist() == [False, True, False, True, True]
    assert not split_otherwise(a, a).any()
    with pytest.raises(ValueError, match="5 texts against 1"):
        split_otherwise(a, to_ragged([[1]]))


def test_the_report_counts_pieces_and_texts_split_otherwise(tok, pairs):
    texts = [de for de, _ in pairs]
    plain = tok.encode_batch(texts)
    drawn = [tok.sample_batch(texts, 0.1, seed) for seed in (1, 2)]
    pieces = np.mean([sum(map(len, d)) / len(texts) for d in drawn])
    differ = np.mean([sum(x != y for x, y in zip(d, plain)) / len(texts) for d in drawn])  # in Python
    base = sum(map(len, plain)) / len(texts)
    line = report(0.1, "texts", {"": (to_ragged(plain), [to_ragged(d) for d in drawn])}, aligned=True)
    assert line == (
        f"subword_dropout=0.1: 2 segmentations of the training texts; {pieces:.2f} pieces a text against "
        f"{base:.2f} deterministic ({pieces / base - 1:+.1%}), {differ:.1%} of texts split otherwise"
    )
    assert 0.5 < differ < 1 and pieces > base


def test_a_pairs_report_names_only_the_sampled_sides(tok, pairs):
    filt = CorpusFilter(max_len=None, max_ratio=None, drop_empty=False)
    plain = SampledParallel(*(to_ragged(tok.encode_batch([p[k] for p in pairs])) for k in (0, 1)))
    samples = [Resegmenter(pairs, tok, tok, 0.1, filt, sides="target").sample([1, k]) for k in (1, 2)]
    line = pairs_report(0.1, plain, samples, sides="target")
    tgt = np.mean([s.tgt.lengths.mean() for s in samples])
    assert line == (
        "subword_dropout=0.1: 2 segmentations of the training pairs; target: "
        f"{tgt:.2f} pieces a text against {plain.tgt.lengths.mean():.2f} deterministic "
        f"({tgt / plain.tgt.lengths.mean() - 1:+.1%}); {len(pairs):,} pairs kept by the filter in each "
        f"against {len(pairs):,} deterministic"
    )  # filtered samples are not aligned with the pairs: no share of texts split otherwise
    # both sides named: the unsampled source is the deterministic one, piece for piece
    source = pairs_report(0.1, plain, samples).split("; ")[1]
    src = f"{plain.src.lengths.mean():.2f}"
    assert source == f"source: {src} pieces a text against {src} deterministic (+0.0%)"


def test_a_pairs_report_says_how_many_pairs_a_length_filter_dropped_from_the_samples(tok, pairs):
    """Sampled segmentations are longer, so a length filter the deterministic one passes drops some
    of their pairs: the line says so (before, nothing did, and the pairs left every epoch silently)."""
    longest = max(len(ids) for p in pairs for ids in tok.encode_batch(list(p)))
    filt = CorpusFilter(max_len=longest, max_ratio=None, drop_empty=False)
    plain = SampledParallel(*(to_ragged(tok.encode_batch([p[k] for p in pairs])) for k in (0, 1)))
    samples = [Resegmenter(pairs, tok, tok, 0.5, filt).sample([1, k]) for k in (1, 2)]
    kept = sorted(len(s) for s in samples)
    assert kept[0] < len(pairs)  # the premise: p = 0.5 lengthens some pair past the deterministic longest
    among = f"{kept[0]:,}" if kept[0] == kept[1] else f"{kept[0]:,}–{kept[1]:,}"
    assert pairs_report(0.5, plain, samples).endswith(
        f"; {among} pairs kept by the filter in each against {len(pairs):,} deterministic"
    )
