"""OPUS-MT tokenization behind aiayn's tokenizer interface, against transformers' MarianTokenizer."""

import pytest

from aiayn.data.tokenizer import Tokenizer
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
    with pytest.raises(FileNotFoundError, match="target.spm is missing"):
        load_marian_tokenizers(tmp_path)
