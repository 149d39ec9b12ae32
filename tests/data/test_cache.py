import os
import pickle

import numpy as np
import pytest

from aiayn import atomic
from aiayn.data import (
    CharTokenizer,
    CorpusFilter,
    DataError,
    encode_parallel,
    encode_text,
    load_parallel,
    load_text,
)

SRC = ["ab", "", "abcabcabcabc", "  ", "a", "abc", "ba"]
TGT = ["ba", "x", "c", "cc", "abcabcabcab", "cab", "ab"]
#       ok   empty  ratio 12  empty  ratio 11   ok     ok


@pytest.fixture
def corpus(tmp_path, write_lines):
    write_lines(tmp_path / "c.de", SRC)
    write_lines(tmp_path / "c.en.gz", TGT)
    return load_parallel(tmp_path / "c")


@pytest.fixture
def tok():
    return CharTokenizer.train("abcx ")


def test_encode_filter_and_count(corpus, tok, tmp_path):
    enc = encode_parallel(corpus, tok, tok, CorpusFilter(max_len=11, max_ratio=3), tmp_path)
    assert (enc.stats.total, enc.stats.kept, enc.stats.empty) == (7, 3, 2)
    assert (enc.stats.too_long, enc.stats.bad_ratio) == (1, 1)  # 12 chars > max_len; 11 / 1 > 3
    assert [tok.decode(s) for s, _ in (enc[i] for i in range(3))] == ["ab", "abc", "ba"]
    assert [tok.decode(t) for t in (enc.tgt[i] for i in range(3))] == ["ba", "cab", "ab"]
    assert enc.src.lengths.tolist() == [2, 3, 2] and enc.src.ids.dtype == np.uint16
    assert isinstance(enc.src.ids, np.memmap)


def test_filter_off_keeps_everything(corpus, tok, tmp_path):
    off = CorpusFilter(drop_empty=False, max_len=None, max_ratio=None)
    enc = encode_parallel(corpus, tok, tok, off, tmp_path)
    assert enc.stats.kept == len(enc) == 7 and enc.src.lengths[1] == 0


def test_chunking_does_not_change_the_result(corpus, tok, tmp_path):
    a = encode_parallel(corpus, tok, tok, cache=tmp_path / "a", chunk_pairs=2)
    b = encode_parallel(corpus, tok, tok, cache=tmp_path / "b")
    for side in ("src", "tgt"):
        assert np.array_equal(getattr(a, side).ids, getattr(b, side).ids)
        assert np.array_equal(getattr(a, side).offsets, getattr(b, side).offsets)


def test_second_run_reads_the_cache(corpus, tok, tmp_path, monkeypatch):
    first = encode_parallel(corpus, tok, tok, cache=tmp_path / "cache")
    monkeypatch.setattr(CharTokenizer, "encode_batch", lambda *a: pytest.fail("re-encoded"))
    second = encode_parallel(corpus, tok, tok, cache=tmp_path / "cache")
    assert second.directory == first.directory and second.stats == first.stats
    assert os.listdir(tmp_path / "cache") == [first.directory.name]  # no temporary folder left


def test_cache_key_follows_content_tokenizer_and_filter(corpus, tok, tmp_path, write_lines):
    base = encode_parallel(corpus, tok, tok, cache=tmp_path).directory
    other_filter = encode_parallel(corpus, tok, tok, CorpusFilter(max_len=5), tmp_path).directory
    other_tok = encode_parallel(corpus, tok, CharTokenizer.train("abcxy "), cache=tmp_path)
    write_lines(corpus.src.path, [s + "a" for s in SRC])  # same name, new content
    edited = encode_parallel(load_parallel(corpus.src.path.with_suffix("")), tok, tok, cache=tmp_path)
    names = {base, other_filter, other_tok.directory, edited.directory}
    assert len(names) == 4


def test_default_env_cache_dir(corpus, tok, tmp_path):
    enc = encode_parallel(corpus, tok, tok)  # AIAYN_CACHE_DIR is set by conftest
    assert enc.directory.parent == tmp_path / "cache"


def test_broken_cache_entry_is_rebuilt(corpus, tok, tmp_path):
    enc = encode_parallel(corpus, tok, tok, cache=tmp_path)
    (enc.directory / "src.offsets").write_bytes(b"\x00" * 8)
    again = encode_parallel(corpus, tok, tok, cache=tmp_path)
    assert len(again) == len(enc) == 3


class Rival:
    """Another process encoding the same corpus: ``publish()`` puts a complete entry at the cache's
    final name once (built elsewhere, renamed in), as that process would on finishing first."""

    def __init__(self, corpus, tok, tmp_path):
        self.corpus, self.tok, self.other = corpus, tok, tmp_path / "other"
        self.cache = tmp_path / "cache"
        self.cache.mkdir()
        self.inode = None

    def publish(self):
        if self.inode is not None:
            return
        self.inode = 0  # the build below passes the same hooks: mark first
        built = encode_parallel(self.corpus, self.tok, self.tok, cache=self.other).directory
        os.rename(built, self.cache / built.name)
        self.inode = (self.cache / built.name).stat().st_ino


def test_an_entry_published_meanwhile_is_kept(corpus, tok, tmp_path, monkeypatch):
    # two members or ranks encode the same corpus at once: the first to finish publishes, the
    # other finds that copy before its rename and keeps it (replacing it would pull it from under
    # the first, whose data-loader workers reopen it by name)
    rival, encode_batch = Rival(corpus, tok, tmp_path), CharTokenizer.encode_batch

    def encode_and_race(self, texts):
        rival.publish()
        return encode_batch(self, texts)

    monkeypatch.setattr(CharTokenizer, "encode_batch", encode_and_race)
    enc = encode_parallel(corpus, tok, tok, cache=rival.cache)
    assert enc.directory.stat().st_ino == rival.inode and len(enc) == 3
    assert os.listdir(rival.cache) == [enc.directory.name]  # ours discarded


def test_losing_the_rename_uses_the_winners_entry(corpus, tok, tmp_path, monkeypatch):
    # the other process publishes between our last look and our rename: the rename fails
    # (a directory cannot replace a non-empty one) and the winner's entry is used
    rival, replace = Rival(corpus, tok, tmp_path), os.replace

    def publish_then_replace(src, dst):
        rival.publish()
        return replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", publish_then_replace)
    enc = encode_parallel(corpus, tok, tok, cache=rival.cache)
    assert enc.directory.stat().st_ino == rival.inode and len(enc) == 3
    assert os.listdir(rival.cache) == [enc.directory.name]


def test_everything_filtered_is_an_error(corpus, tok, tmp_path):
    with pytest.raises(DataError, match=r"c\.de and .*c\.en\.gz: every pair was filtered out"):
        encode_parallel(corpus, tok, tok, CorpusFilter(max_len=1), tmp_path / "cache")
    assert os.listdir(tmp_path / "cache") == []


def test_dataset_pickles_by_path(corpus, tok, tmp_path):
    enc = encode_parallel(corpus, tok, tok, cache=tmp_path)
    blob = pickle.dumps(enc)
    assert len(blob) < 500  # the folder name, not the arrays
    back = pickle.loads(blob)
    assert all(np.array_equal(a, b) for a, b in zip(back[1], enc[1], strict=True))


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_default_filter_keeps_standard_multi30k(m30k_tok, m30k_train, split):
    enc = (
        m30k_train
        if split == "train"
        else encode_parallel(load_parallel("multi30k", split), m30k_tok, m30k_tok)
    )
    assert enc.stats.kept == enc.stats.total == {"train": 29000, "valid": 1014, "test": 1000}[split]


def test_encode_text(tmp_path):
    corpus = load_text("shakespeare", "valid")
    tok = CharTokenizer.train(load_text("shakespeare", "train").chunks())
    enc = encode_text(corpus, tok, tmp_path)
    assert len(enc) == len(corpus) == 111_540 and tok.unk_id not in enc.tokens
    assert tok.decode(enc.tokens) == corpus.text()
    assert encode_text(corpus, tok, tmp_path).directory == enc.directory


def test_an_encoded_text_cut_short_is_encoded_again(tmp_path):
    """tokens.ids shorter than its meta.json's count (a crash before the data reached the disk) is no
    entry: the text is encoded again, whole."""
    corpus = load_text("shakespeare", "valid")
    tok = CharTokenizer.train(load_text("shakespeare", "train").chunks())
    enc = encode_text(corpus, tok, tmp_path)
    ids = enc.directory / "tokens.ids"
    ids.write_bytes(ids.read_bytes()[: ids.stat().st_size // 2])
    again = encode_text(corpus, tok, tmp_path)
    assert len(again) == len(corpus) == 111_540 and tok.decode(again.tokens) == corpus.text()
