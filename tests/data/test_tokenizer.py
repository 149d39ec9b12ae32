import json
import re

import pytest
import sentencepiece as spm

from aiayn.data import (
    CharTokenizer,
    DataError,
    SentencePieceTokenizer,
    load_parallel,
    load_tokenizer,
    load_translation_tokenizers,
    save_translation_tokenizers,
    train_translation_tokenizers,
)

TEXTS = [
    "",
    "A man in an orange hat starring at something.",
    "Ein Mädchen läuft über die Straße, à côté.",
    "e\u0301 vs \u00e9, ﬁ ligature, ½, full-width Ａ",  # NFKC would change these; we must not
    "emoji 😀🇩🇪 and 中文 and русский",
    "  two  spaces,\ttab, trailing space ",
    "no\u00a0break",
]
CORPUS = [t for t in TEXTS if t] * 20 + list(load_parallel("multi30k", "valid").sentences())


@pytest.fixture(scope="module", params=["bpe", "unigram", "char"])
def tok(request):
    if request.param == "char":
        return CharTokenizer.train(CORPUS)
    return SentencePieceTokenizer.train(CORPUS, vocab_size=400, model_type=request.param)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_lossless(tok, text):
    ids = tok.encode(text)
    assert all(tok.unk_id < i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_unseen_characters(tok):
    text = "never seen: ⛵ ǅ Ω 𝔘"
    if tok.kind == "char":  # unk, shown as such
        assert tok.decode(tok.encode(text)) == "never seen: \u2047 \u2047 \u2047 \u2047"
    else:  # byte fallback: still lossless
        assert tok.decode(tok.encode(text)) == text and tok.unk_id not in tok.encode(text)


def test_special_ids_and_shared_interface(tok):
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.encode_batch(TEXTS[1:3]) == [tok.encode(TEXTS[1]), tok.encode(TEXTS[2])]
    ids = tok.encode("fox")
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id, tok.pad_id]) == "fox"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_save_and_load(tok, tmp_path):
    tok.save(tmp_path / "tok")
    back = load_tokenizer(tmp_path / "tok")
    assert type(back) is type(tok) and back.model_bytes() == tok.model_bytes()
    assert back.encode(TEXTS[4]) == tok.encode(TEXTS[4])
    assert json.loads((tmp_path / "tok" / "tokenizer.json").read_text())["kind"] == tok.kind


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_a_lowercase_vocabulary_reads_every_text_as_str_lower_of_it(model_type, tmp_path):
    """``lowercase=True`` against Python's ``str.lower``, character by character (final Σ aside: a
    rule table has no context), with title case (ǅ), a lowercase that is two code points (İ), ß
    kept; the rule lives in the model file, so sentencepiece itself reading it lowercases too."""
    tok = SentencePieceTokenizer.train(CORPUS, vocab_size=400, model_type=model_type, lowercase=True)
    cased = SentencePieceTokenizer.train(CORPUS, vocab_size=400, model_type=model_type)
    assert tok.lowercase and not cased.lowercase and not CharTokenizer.train("Ab").lowercase
    for text in [*TEXTS, "ÄRGER IN DER STRASSE, Straße; ǅemal İstanbul ΑΘΉΝΑ", "Ein Mann"]:
        assert tok.decode(tok.encode(text)) == text.lower()
        assert tok.encode(text) == tok.encode(text.lower())
    assert cased.decode(cased.encode("Ein Mann")) == "Ein Mann"
    back = load_tokenizer(tok.save(tmp_path / "tok"))
    assert back.lowercase and back.encode("Ein Mann") == tok.encode("ein mann")
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tok" / "spm.model"))
    assert sp.decode(sp.encode("ZWEI HUNDE")) == "zwei hunde"


def test_char_unknown_is_unk_and_decodes_visibly():
    tok = CharTokenizer.train("abc\n")
    assert tok.vocab_size == 8 and tok.encode("ab") == [5, 6]
    assert tok.encode("aZ") == [5, tok.unk_id]
    assert tok.decode(tok.encode("aZ")) == "a\u2047"


@pytest.mark.parametrize("side", ["src", "tgt"])
def test_multi30k_valid_round_trip(m30k_tok, side):
    corpus = load_parallel("multi30k", "valid")
    sentences = list(corpus.sentences(side))
    assert sum("\u00a0" in s for s in sentences) == (1 if side == "src" else 0)  # the NFKC trap
    for s, ids in zip(sentences, m30k_tok.encode_batch(sentences), strict=True):
        assert m30k_tok.decode(ids) == s


@pytest.mark.parametrize("lowercase", [False, True])  # True: its rule table is a new temporary file each time
def test_training_is_deterministic(lowercase):
    sentences = list(load_parallel("multi30k", "valid").sentences())
    for model_type in ("bpe", "unigram"):
        a = SentencePieceTokenizer.train(sentences, 1000, model_type, lowercase=lowercase)
        b = SentencePieceTokenizer.train(iter(sentences), 1000, model_type, lowercase=lowercase)
        assert a.model_bytes() == b.model_bytes() and a.lowercase is lowercase


def test_training_errors_are_actionable():
    with pytest.raises(DataError, match="vocabulary of 5000 pieces: Vocabulary size too high"):
        SentencePieceTokenizer.train(CORPUS, vocab_size=5000, model_type="unigram")
    with pytest.raises(DataError, match="could not train"):
        SentencePieceTokenizer.train([], vocab_size=300)
    with pytest.raises(DataError, match="empty text"):
        CharTokenizer.train("")


def test_corpus_errors_while_training_keep_their_type():
    def sentences():
        yield from CORPUS
        raise DataError("x.de: line 9 is not valid UTF-8")

    with pytest.raises(DataError, match="line 9"):
        SentencePieceTokenizer.train(sentences(), vocab_size=300)


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="tokenizer.json is missing"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"kind": "wordpiece"}')
    with pytest.raises(DataError, match="kind one of sentencepiece, char"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"kind": "sentencepiece"}')
    with pytest.raises(DataError, match="spm.model is missing"):
        load_tokenizer(tmp_path)


@pytest.fixture(scope="module")
def saved_spm(tmp_path_factory):
    """A saved sentencepiece tokenizer's folder and its model bytes."""
    directory = tmp_path_factory.mktemp("spm")
    SentencePieceTokenizer.train(CORPUS, vocab_size=400).save(directory)
    return directory, (directory / "spm.model").read_bytes()


@pytest.mark.parametrize("damage", ["random", "truncated", "empty"])
def test_corrupt_sentencepiece_model_names_the_file(tmp_path, saved_spm, damage):
    source, model = saved_spm
    (tmp_path / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    bad = {"random": bytes(range(256)) * 4, "truncated": model[: len(model) // 2], "empty": b""}[damage]
    (tmp_path / "spm.model").write_bytes(bad)
    with pytest.raises(DataError) as info:
        load_tokenizer(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'spm.model'} is ")
    assert "not a sentencepiece model" in message or "not a valid sentencepiece model" in message
    assert message.endswith("retrain or restore the tokenizer")
    assert "INTERNAL" not in message and "ParseFromArray" not in message


@pytest.mark.parametrize("kind", ["sentencepiece", "char"])
def test_truncated_tokenizer_meta_names_the_file(tmp_path, saved_spm, kind):
    if kind == "char":
        CharTokenizer.train("abc").save(tmp_path)
    else:
        for name in ("tokenizer.json", "spm.model"):
            (tmp_path / name).write_bytes((saved_spm[0] / name).read_bytes())
    meta = (tmp_path / "tokenizer.json").read_bytes()
    (tmp_path / "tokenizer.json").write_bytes(meta[: len(meta) // 2])
    with pytest.raises(
        DataError, match=r"tokenizer\.json is not valid JSON \(.*\); it is truncated or corrupt"
    ):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes(b"\xff\xfe" + meta)
    with pytest.raises(DataError, match=r"tokenizer\.json is not valid JSON"):
        load_tokenizer(tmp_path)


def test_tokenizer_meta_fields_of_the_wrong_type_name_the_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"kind": ["char"]}')
    with pytest.raises(DataError, match="tokenizer.json: not a tokenizer description"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"kind": "char", "chars": [1, 2]}')
    with pytest.raises(DataError, match="tokenizer.json: has no list of characters"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"kind": "sentencepiece", "model_file": 3}')
    with pytest.raises(DataError, match="tokenizer.json: 'model_file' must be a file name in .*, got 3"):
        load_tokenizer(tmp_path)
    for outside in ("../spm.model", "/etc/passwd", "sub/spm.model", ".."):  # beside tokenizer.json only
        (tmp_path / "tokenizer.json").write_text(json.dumps({"kind": "sentencepiece", "model_file": outside}))
        with pytest.raises(
            DataError, match=f"'model_file' must be a file name in .*, got {re.escape(repr(outside))}"
        ):
            load_tokenizer(tmp_path)


@pytest.mark.parametrize("joint", [True, False])
def test_a_vocabulary_the_corpus_cannot_fill_names_the_files(tmp_path, write_lines, joint):
    write_lines(tmp_path / "c.de", ["ein kleiner Satz", "noch einer"])
    write_lines(tmp_path / "c.en", ["a small sentence", "another one"])
    files = r"c\.de and .*c\.en" if joint else r"c\.de"
    with pytest.raises(DataError, match=rf"vocabulary of 8000 pieces on .*{files}: Vocabulary size too high"):
        train_translation_tokenizers(load_parallel(tmp_path / "c"), 8000, joint=joint)


@pytest.mark.parametrize("joint", [True, False])
def test_translation_pair_joint_or_per_side(tmp_path, write_lines, joint):
    pairs = list(load_parallel("multi30k", "valid"))
    write_lines(tmp_path / "c.de", [de for de, _ in pairs])
    write_lines(tmp_path / "c.en", [en for _, en in pairs])
    src, tgt = train_translation_tokenizers(load_parallel(tmp_path / "c"), 500, joint=joint)
    assert (src is tgt) is joint
    src2, tgt2 = load_translation_tokenizers(save_translation_tokenizers(tmp_path / "t", src, tgt))
    assert (src2 is tgt2) is joint
    assert (src2.model_bytes(), tgt2.model_bytes()) == (src.model_bytes(), tgt.model_bytes())


def test_few_and_many_texts_encode_to_the_same_ids(tok):
    """Few texts are encoded one call each, many by sentencepiece's threaded call: the same ids."""
    from aiayn.data.tokenizer import SP_THREADED_BATCH

    many = CORPUS[: 2 * SP_THREADED_BATCH]
    one_by_one = [tok.encode(t) for t in many]
    assert tok.encode_batch(many) == one_by_one
    assert tok.encode_batch(many[:3]) == one_by_one[:3] and tok.encode_batch([]) == []


def test_texts_longer_than_sentencepieces_default_limit_shape_the_vocabulary():
    """sentencepiece silently leaves texts over 4,192 bytes out of training: documents of one line
    each would then never shape the vocabulary (or leave nothing to train on)."""
    docs = [" ".join(f"zebra{i % 7} quokka" for i in range(600))] * 20  # about 8,000 bytes each
    tok = SentencePieceTokenizer.train(docs, 300)
    assert len(docs[0].encode()) > 4192 and len(tok.encode("zebra3 quokka")) <= 3


def test_a_stream_vocabulary_puts_no_word_boundary_before_a_text():
    """``add_dummy_prefix=False`` (a language model's stream): a line's first word is encoded as the
    stream holds it, with no "▁" before it."""
    lines = ["First Citizen:", "Before we proceed any further, hear me speak."] * 50
    tok = SentencePieceTokenizer.train(lines, 300, add_dummy_prefix=False)
    stream = tok.encode("\n".join(lines[:2]))
    assert stream[: len(tok.encode(lines[0]))] == tok.encode(lines[0])
    assert not tok.sp.id_to_piece(tok.encode("Before")[0]).startswith("\u2581")
