import pytest

from aiayn.data import CorpusFilter, DataError, FilterStats, load_parallel, load_text
from aiayn.data.sentences import load_sentences

MULTI30K_SIZES = {"train": 29000, "valid": 1014, "test": 1000}


@pytest.mark.parametrize("split", MULTI30K_SIZES)
@pytest.mark.parametrize("langs", [("de", "en"), ("en", "de")])
def test_multi30k_splits_and_directions(split, langs):
    corpus = load_parallel("multi30k", split, *langs)
    assert len(corpus) == MULTI30K_SIZES[split]
    assert corpus.src.path.name.startswith(
        {"valid": "val.", "test": "test_2016_flickr."}.get(split, "train.")
    )
    assert corpus.src.path.name.split(".")[-2] == langs[0]


def test_multi30k_pairs_are_aligned():
    corpus = load_parallel("multi30k", "valid")
    assert corpus.name == "multi30k.valid.de-en"  # names cache folders
    src, tgt = next(iter(corpus))
    assert src.startswith("Eine Gruppe von Männern lädt Baumwolle")
    assert tgt.startswith("A group of men are loading cotton")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(split="dev"), "split='dev' is not one of train, valid, test"),
        (dict(src_lang="fr"), "multi30k has languages de and en, not 'fr'"),
        (dict(src_lang="en", tgt_lang="en"), "both 'en'"),
    ],
)
def test_multi30k_bad_arguments(kwargs, message):
    with pytest.raises(DataError, match=message):
        load_parallel("multi30k", **kwargs)


def test_line_count_mismatch_names_both_files_and_counts(tmp_path, write_lines):
    write_lines(tmp_path / "train.de", ["a", "b", "c"])
    write_lines(tmp_path / "train.en", ["a", "b"])
    with pytest.raises(DataError, match=r"train\.de has 3 lines but .*train\.en has 2"):
        load_parallel(tmp_path / "train")


def test_user_corpus_as_pair_folder_or_prefix(tmp_path, write_lines):
    write_lines(tmp_path / "a.src", ["x1", "x2"])
    write_lines(tmp_path / "a.tgt.gz", ["y1", "y2"])  # either side may be gzipped
    write_lines(tmp_path / "val.de", ["v"])  # "valid" may be named val (or dev)
    write_lines(tmp_path / "val.en", ["w"])
    by_prefix = load_parallel(tmp_path / "a", src_lang="src", tgt_lang="tgt")
    by_pair = load_parallel((tmp_path / "a.src", tmp_path / "a.tgt.gz"), src_lang="s", tgt_lang="t")
    assert list(by_prefix) == list(by_pair) == [("x1", "y1"), ("x2", "y2")]
    assert list(by_prefix.sentences()) == ["x1", "x2", "y1", "y2"]
    assert list(load_parallel(tmp_path, "valid")) == [("v", "w")]


def test_missing_side_says_which_file(tmp_path, write_lines):
    write_lines(tmp_path / "train.de", ["a"])
    with pytest.raises(DataError, match=r"train\.en: no such file"):
        load_parallel(tmp_path, "train")


@pytest.mark.parametrize("name", ["train.de", "train.en.gz"])
def test_corpus_of_only_blank_lines_names_the_file(tmp_path, write_lines, name):
    write_lines(tmp_path / "train.de", ["ein Satz", "zwei"])
    write_lines(tmp_path / "train.en.gz", ["a sentence", "two"])
    write_lines(tmp_path / name, ["", "  ", "\t"])
    with pytest.raises(DataError, match=rf"{name}\b.* holds only blank lines \(3 lines, no text\)"):
        load_parallel(tmp_path, "train")
    (tmp_path / "lm.txt").write_text("\n\n\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"lm\.txt holds only blank lines"):
        load_text(tmp_path / "lm.txt")


def test_shakespeare_follows_nanogpt_split():
    train, valid = load_text("shakespeare", "train"), load_text("shakespeare", "valid")
    assert (len(train), len(valid)) == (1_003_854, 111_540)  # nanoGPT's shakespeare_char numbers
    assert train.text().startswith("First Citizen:\nBefore we proceed")
    assert valid.text()[:9] == "?\n\nGREMIO"


def test_user_text_file_split(tmp_path, write_lines):
    path = write_lines(tmp_path / "t.txt.gz", ["0123456789"] * 10)  # 110 characters
    assert load_text(path, "train").text() == ("0123456789\n" * 9)[:99]
    assert len(load_text(path, "valid", valid_fraction=0.5)) == 55
    assert len(load_text(path, "all")) == 110
    (tmp_path / "one").write_text("x")
    with pytest.raises(DataError, match="the train split is empty"):
        load_text(tmp_path / "one")
    with pytest.raises(DataError, match="valid_fraction=1.5"):
        load_text(path, valid_fraction=1.5)


def test_a_file_of_sentences_is_cut_between_lines(tmp_path, write_lines):
    """Before, the sentence tasks cut a text file where an LM's is cut, inside a line: its first half
    trained and its second half validated."""
    lines = [f"short {i}" for i in range(9)] + ["a much longer final sentence that holds many words"]
    path = write_lines(tmp_path / "s.txt.gz", [*lines, "end"])  # 72 + 51 + 4 = 127 characters
    assert load_text(path, "train").stop == 114  # 90%: inside line 10, where an LM's text is cut (nanoGPT)
    train, valid = load_text(path, "train", whole_lines=True), load_text(path, "valid", whole_lines=True)
    assert (train.stop, valid.start) == (123, 123) and train.text().splitlines() == lines
    assert load_sentences(path, "train")[0] == lines and load_sentences(path, "valid")[0] == ["end"]
    even = write_lines(tmp_path / "even.txt", ["0123456789"] * 10)  # 90% is line 10's start: no move
    assert load_text(even, "train", whole_lines=True).stop == load_text(even, "train").stop == 99
    last = write_lines(tmp_path / "last.txt", ["a", "b" * 20])  # 90% falls inside the last line
    with pytest.raises(DataError, match="valid split is empty .*the cut falls in its last line"):
        load_sentences(last, "valid")


@pytest.mark.parametrize(
    "pair,lengths,reason",
    [
        (("a", "b"), (1, 1), None),
        (("", "b"), (0, 1), "empty"),
        (("a", "  \t"), (1, 1), "empty"),  # whitespace only, even though it has tokens
        (("a", "b"), (257, 3), "too_long"),
        (("a", "b"), (10, 1), "bad_ratio"),
        (("a", "b"), (9, 1), None),  # a ratio of exactly max_ratio is kept
    ],
)
def test_filter_reasons(pair, lengths, reason):
    assert CorpusFilter().reason(*pair, *lengths) == reason


def test_filter_options_can_be_switched_off():
    off = CorpusFilter(drop_empty=False, max_len=None, max_ratio=None)
    assert off.reason("", "b", 0, 1000) is None
    with pytest.raises(ValueError, match="max_len=0"):
        CorpusFilter(max_len=0)
    with pytest.raises(ValueError, match="max_ratio=0.5"):
        CorpusFilter(max_ratio=0.5)
    assert str(FilterStats(10, 7, 1, 1, 1)) == (
        "kept 7 of 10 pairs (dropped 1 empty, 1 over max_len, 1 over max_ratio)"
    )
