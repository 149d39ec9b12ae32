"""GPT-2's byte-level BPE behind aiayn's tokenizer interface, and ``aiayn generate`` on a GPT-2 directory."""

import json
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.cli.main import main
from aiayn.decoding.generator import Generator
from aiayn.decoding.options import SearchConfig
from aiayn.errors import ModelDirError
from aiayn.interop import GPT2Tokenizer, load_gpt2_tokenizer
from tests.interop.hf_builders import gpt2, transformers

tokenizers = pytest.importorskip("tokenizers")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024, isn't it?",
    "Hello world! Hello, GPT-2 tokenizer: byte-level BPE with 50,000 merges.",
    "   leading spaces, trailing spaces   ",
    "Ünïcödé, emoji 🙂 and 漢字 become bytes first.",
]
TEXTS = [*CORPUS, "", " ", "unseen words: xylophone zebra\n\nnew lines\ttabs", "they'll we've I'm"]


@pytest.fixture
def gpt2_files(tmp_path):
    """vocab.json + merges.txt of a 320-piece byte-level BPE trained here (id 0 = <|endoftext|>)."""
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 5, vocab_size=320, min_frequency=1, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(tmp_path))
    return tmp_path, json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("text", TEXTS)
def test_encode_and_decode_match_transformers(gpt2_files, text):
    directory, _ = gpt2_files
    ours = load_gpt2_tokenizer(directory)
    hf = transformers.GPT2Tokenizer.from_pretrained(directory)
    ids = ours.encode(text)
    assert ids == hf(text).input_ids
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True) == text
    assert isinstance(ours, GPT2Tokenizer) and ours.decode([*ids, ours.eos_id]) == text


def test_broken_tokenizer_files_are_named(gpt2_files):
    directory, vocab = gpt2_files
    merges = (directory / "merges.txt").read_bytes()
    (directory / "merges.txt").write_bytes(merges + b"\xff\xfe\n")
    with pytest.raises(ModelDirError, match=r"merges\.txt is not valid UTF-8"):
        load_gpt2_tokenizer(directory)
    (directory / "merges.txt").write_bytes(merges + b"zz qq\n")
    with pytest.raises(ModelDirError, match=r"merges\.txt and .*vocab\.json do not belong together: 1 piece"):
        load_gpt2_tokenizer(directory)
    (directory / "merges.txt").write_bytes(merges)
    (directory / "vocab.json").write_text(
        json.dumps({k: v for k, v in vocab.items() if k != "<|endoftext|>"})
    )
    with pytest.raises(ModelDirError, match=r"vocab\.json: the vocabulary lacks the end-of-text piece"):
        load_gpt2_tokenizer(directory)
    (directory / "vocab.json").write_text(json.dumps(vocab)[:-20])
    with pytest.raises(ModelDirError, match=r"vocab\.json is not valid JSON"):
        load_gpt2_tokenizer(directory)


def test_tokens_added_to_the_vocabulary_are_refused_not_split_into_bytes(gpt2_files):
    """transformers reads "<|sep|>" as one added id; aiayn read vocab.json and merges.txt only and split
    it into bytes, and never emitted the added ids."""
    directory, _ = gpt2_files
    hf = transformers.GPT2Tokenizer.from_pretrained(directory)
    hf.add_special_tokens({"pad_token": "<|endoftext|>", "additional_special_tokens": ["<|sep|>"]})
    hf.save_pretrained(directory)  # the model's own <|endoftext|> as padding adds nothing: not refused
    with pytest.raises(ModelDirError, match=r"has tokens added to GPT-2's vocabulary \('<\|sep\|>'\)"):
        load_gpt2_tokenizer(directory)


def test_generate_command_matches_transformers(gpt2_files, capsys):
    directory, vocab = gpt2_files
    eos = vocab["<|endoftext|>"]
    hf = gpt2(directory, vocab_size=len(vocab), bos_token_id=eos, eos_token_id=eos, n_positions=64)
    prompt = "The quick brown fox"
    assert (
        main(["generate", "--model", str(directory), "--prompt", prompt, "--greedy", "--max-new-tokens", "9"])
        == 0
    )
    tok = transformers.GPT2Tokenizer.from_pretrained(directory)
    ids = torch.tensor([tok(prompt).input_ids])
    fixed = dict(max_new_tokens=9, min_new_tokens=9)
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=eos, **fixed)
    assert capsys.readouterr().out == prompt + tok.decode(out[0, ids.size(1) :]) + "\n"


def test_rows_past_the_tokenizer_are_never_generated(gpt2_files, capsys):
    """A checkpoint's vocabulary padded to a round size (nanoGPT's 50,304 for GPT-2's 50,257): the
    rows without a token are never emitted, even where the model prefers them (they crashed decoding)."""
    directory, vocab = gpt2_files
    eos = vocab["<|endoftext|>"]
    hf = gpt2(directory, vocab_size=len(vocab) + 12, bos_token_id=eos, eos_token_id=eos, n_positions=64)
    with torch.no_grad():  # padded rows far longer than the others: the argmax lands on one of them
        wte = hf.transformer.wte.weight
        wte[len(vocab) :] = 50 * torch.randn(12, wte.size(1), generator=torch.Generator().manual_seed(0))
    hf.save_pretrained(directory)
    with torch.no_grad():
        logits = hf(torch.tensor([load_gpt2_tokenizer(directory).encode("The")])).logits[0, -1]
    assert int(logits.argmax()) >= len(vocab)  # transformers' choice: a row with no token
    args = ["generate", "--model", str(directory), "--prompt", "The", "--max-new-tokens", "6"]
    assert main([*args, "--greedy"]) == 0 and main([*args, "--seed", "1"]) == 0
    assert capsys.readouterr().out.count("The") >= 2
    (hyp,) = Generator.from_dir(directory).complete("The", 6, SearchConfig(beam=4, min_len=6))
    assert len(hyp.tokens) == 6 and max(hyp.tokens) < len(vocab)


def test_end_of_text_written_in_the_text_is_the_special_token(gpt2_files):
    """As transformers reads it: a written ``<|endoftext|>`` is the one eos id, not its characters."""
    directory, vocab = gpt2_files
    ours, hf = load_gpt2_tokenizer(directory), transformers.GPT2Tokenizer.from_pretrained(directory)
    text = "one<|endoftext|>two <|endoftext|>"
    ids = ours.encode(text)
    assert ids == hf(text).input_ids and ids.count(vocab["<|endoftext|>"]) == 2
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True) == "onetwo "


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    """(ours, transformers') tokenizers of one trained vocabulary, shared by the property tests."""
    directory = tmp_path_factory.mktemp("gpt2")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 5, vocab_size=320, min_frequency=1, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(directory))
    return load_gpt2_tokenizer(directory), transformers.GPT2Tokenizer.from_pretrained(directory)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=40))
def test_any_text_encodes_as_transformers_and_round_trips(gpt2_pair, text):
    ours, hf = gpt2_pair
    ids = ours.encode(text)
    assert ids == hf(text).input_ids
    if "<|endoftext|>" not in text:
        assert ours.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_any_ids_decode_as_transformers(gpt2_pair, data):
    """Byte pieces that end mid-character included: both decode them as U+FFFD."""
    ours, hf = gpt2_pair
    ids = data.draw(st.lists(st.integers(0, ours.vocab_size - 1), max_size=12))
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_without_the_tokenizers_library_the_error_says_what_to_install(gpt2_files, monkeypatch, capsys):
    directory, vocab = gpt2_files
    eos = vocab["<|endoftext|>"]
    gpt2(directory, vocab_size=len(vocab), bos_token_id=eos, eos_token_id=eos, n_positions=64)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # ``import tokenizers`` now raises ImportError
    install = r"GPT-2's tokenizer needs the tokenizers package: pip install 'aiayn\[hf\]'"
    with pytest.raises(ModelDirError, match=install):
        load_gpt2_tokenizer(directory)
    assert main(["generate", "--model", str(directory), "--prompt", "The", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'aiayn[hf]'" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_attention_labels_show_a_gpt2_tokens_space_and_never_call_its_padding_stand_in_pad(gpt2_files):
    """A GPT-2 without a padding token pads with its highest real token (``default_pad_id``): a prompt
    holding that token showed "<pad>" on the map. A piece's leading space shows as "␣"."""
    from types import SimpleNamespace

    from aiayn.decoding.maps import token_labels
    from aiayn.interop.gpt2.convert import default_pad_id

    directory, vocab = gpt2_files
    tok = load_gpt2_tokenizer(directory)
    pad = default_pad_id(len(vocab), {tok.eos_id})
    config = SimpleNamespace(pad_id=pad, bos_id=tok.eos_id, eos_id=tok.eos_id, unk_id=tok.eos_id)
    ids = tok.encode("Hello world")
    labels = token_labels(tok, [tok.eos_id, *ids, pad], config)
    assert labels[0] == "<s>" and labels[-1] == tok.decode([pad]).replace(" ", "␣") != "<pad>"
    assert labels[1:-1] == [tok.decode([i]).replace(" ", "␣") for i in ids] and labels[2].startswith("␣")
