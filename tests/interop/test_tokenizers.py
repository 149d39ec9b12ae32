"""OPUS-MT tokenization behind aiayn's tokenizer interface, against transformers' MarianTokenizer."""

import json

import pytest

from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import ModelDirError
from aiayn.interop import load_marian_tokenizers
from tests.interop.hf_builders import transformers
from tests.interop.marian_files import write_marian_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

TEXTS = [
    "Ein Mann fährt Fahrrad.",
    "Zwei  Hunde spielen im Schnee!",
    "",
    "   ",
    "Unbekannte Zeichen: 🙂 ∑ 漢字",
    ">>fra<< Der alte Mann sitzt.",
    ">>xyz<< unknown language code",
]


@pytest.fixture
def marian_tokenizers(tmp_path):
    vocab = write_marian_tokenizer(tmp_path)
    hf = transformers.MarianTokenizer(str(tmp_path / "source.spm"), str(tmp_path / "target.spm"),
                                      str(tmp_path / "vocab.json"))  # fmt: skip
    return (*load_marian_tokenizers(tmp_path), hf, vocab)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_marian_tokenizer_plus_eos(marian_tokenizers, text):
    src, _, hf, _ = marian_tokenizers
    assert src.encode(text) + [src.eos_id] == hf(text).input_ids


def test_decode_matches_marian_tokenizer_skipping_specials(marian_tokenizers):
    _, tgt, hf, vocab = marian_tokenizers
    for text in ["A man rides a bike.", "Two dogs play in the snow.", "The sun, the moon!"]:
        ids = hf(text_target=text).input_ids
        assert tgt.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    a, dog = (hf(text_target=w).input_ids[:-1] for w in ("A", "dog"))
    ids = [*a, vocab["<unk>"], *dog, vocab["</s>"], vocab["<pad>"]]
    assert tgt.decode(ids) == hf.decode(ids, skip_special_tokens=True) == "A dog"


def test_interface_and_special_ids(marian_tokenizers):
    src, tgt, _, vocab = marian_tokenizers
    assert isinstance(src, Tokenizer)
    assert (src.eos_id, src.unk_id, src.pad_id, src.bos_id) == (0, 1, vocab["<pad>"], vocab["<pad>"])
    assert src.vocab_size == tgt.vocab_size == len(vocab)
    assert src.encode_batch(["Ein Hund.", "Die Sonne."]) == [
        src.encode("Ein Hund."),
        src.encode("Die Sonne."),
    ]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tgt.decode([len(vocab)])


def test_missing_files_are_named(tmp_path):
    write_marian_tokenizer(tmp_path)
    (tmp_path / "target.spm").unlink()
    with pytest.raises(ModelDirError, match="target.spm is missing"):
        load_marian_tokenizers(tmp_path)


@pytest.mark.parametrize("damage", ["random", "truncated"])
def test_corrupt_sentencepiece_file_is_named(tmp_path, damage):
    write_marian_tokenizer(tmp_path)
    model = (tmp_path / "source.spm").read_bytes()
    bad = bytes(range(256)) * 4 if damage == "random" else model[: len(model) // 2]
    (tmp_path / "source.spm").write_bytes(bad)
    with pytest.raises(ModelDirError, match=r"source\.spm is not a valid sentencepiece model") as info:
        load_marian_tokenizers(tmp_path)
    assert "INTERNAL" not in str(info.value) and "ParseFromArray" not in str(info.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"</s>": 0, "<unk>": 1', r"vocab\.json is not valid JSON \(.*\); restore it"),
        ("[1, 2, 3]", r"vocab\.json does not hold a JSON object"),
        ('{"</s>": 0, "<unk>": "1", "<pad>": 2}', r"vocab\.json does not map pieces to integer ids"),
        ('{"</s>": 0, "<unk>": 1}', r"vocab\.json: the vocabulary lacks the special piece\(s\) \['<pad>'\]"),
        ('{"</s>": 0, "<unk>": 1, "<pad>": 2, "a": 1}', r"vocab\.json gives id 1 to both '<unk>' and 'a'"),
    ],
)
def test_corrupt_vocab_json_is_named(tmp_path, content, message):
    write_marian_tokenizer(tmp_path)
    (tmp_path / "vocab.json").write_text(content, encoding="utf-8")
    with pytest.raises(ModelDirError, match=message):
        load_marian_tokenizers(tmp_path)


def test_corrupt_target_vocab_json_is_named(tmp_path):
    vocab = write_marian_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": True}))
    (tmp_path / "target_vocab.json").write_text(json.dumps({k: v for k, v in vocab.items() if k != "</s>"}))
    with pytest.raises(ModelDirError, match=r"target_vocab\.json: the vocabulary lacks the special piece"):
        load_marian_tokenizers(tmp_path)


def test_an_id_that_no_piece_has_decodes_to_nothing(tmp_path):
    """A gap in vocab.json's ids went through sentencepiece's own id table (another piece, or a
    traceback past its end); transformers' MarianTokenizer reads it as unknown, dropped."""
    vocab = write_marian_tokenizer(tmp_path)
    moved = next(p for p, i in vocab.items() if i == 10)
    (tmp_path / "vocab.json").write_text(json.dumps({**vocab, moved: len(vocab) + 3}))
    src, _ = load_marian_tokenizers(tmp_path)
    assert src.vocab_size == len(vocab) + 4 and src.decode([10]) == ""  # 10 holds no piece now
    assert src.decode([len(vocab) + 3]) == src.sp.decode_pieces([moved]).strip() != ""  # its new id, emitted


def test_attention_labels_a_marian_piece_that_decodes_to_nothing_by_the_piece(marian_tokenizers):
    """A lone word boundary and <unk> decode to nothing in a Marian vocabulary: labelled by their
    pieces (a space shown, "<unk>"), not by their ids."""
    from types import SimpleNamespace

    from aiayn.decoding.maps import token_labels

    src, _, _, vocab = marian_tokenizers
    config = SimpleNamespace(pad_id=src.pad_id, bos_id=src.bos_id, eos_id=src.eos_id)
    quiet = [i for p, i in vocab.items() if p in ("\u2581", "<unk>")]
    assert quiet and all(src.decode([i]) == "" for i in quiet)
    labels = token_labels(src, quiet, config)
    assert labels == ["␣" if src.pieces[i] == "\u2581" else "<unk>" for i in quiet]


def test_an_exported_marian_tokenizer_names_its_own_special_pieces(tmp_path):
    """A sentencepiece model whose specials are called [PAD], [BOS], … (ids 0–3, as aiayn needs) wrote
    a tokenizer_config.json naming <pad>, <s>, …, which its vocabulary lacks: MarianTokenizer refused
    it. The names are now the model's own, and transformers reads the ids aiayn uses."""
    import io

    import sentencepiece as spm

    from aiayn.data.tokenizer import SentencePieceTokenizer
    from aiayn.interop.marian.tokenizer import save_marian_tokenizer

    text = ["ein mann fährt fahrrad", "eine frau liest ein buch", "zwei hunde spielen im park"] * 30
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=40, model_type="bpe",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[BOS]", eos_piece="[EOS]",
        unk_piece="[UNK]", minloglevel=2,
    )  # fmt: skip
    tok = SentencePieceTokenizer(model.getvalue())
    save_marian_tokenizer(tmp_path, tok, tok, "de", "en")
    hf = transformers.MarianTokenizer.from_pretrained(tmp_path)
    assert (hf.pad_token, hf.eos_token, hf.unk_token) == ("[PAD]", "[EOS]", "[UNK]")
    assert (hf.pad_token_id, hf.eos_token_id, hf.unk_token_id) == (0, 2, 3)
    assert hf("ein mann").input_ids == [*tok.encode("ein mann"), tok.eos_id]
