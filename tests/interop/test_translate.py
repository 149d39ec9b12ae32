"""``aiayn translate --model DIR`` on an OPUS-MT-style directory gives what transformers gives."""

import json

import pytest
import torch

from aiayn.cli.main import main
from aiayn.errors import ModelDirError
from aiayn.interop import load_marian_translation
from tests.interop.hf_builders import marian, transformers
from tests.interop.marian_files import write_marian_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
LINES = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee.", "Die Sonne scheint über den Bergen."]


@pytest.fixture
def opus_mt_dir(tmp_path):
    """Tokenizer files plus a random model over their vocabulary, eos made likely so outputs end."""
    vocab = write_marian_tokenizer(tmp_path)
    pad = vocab["<pad>"]
    hf = marian(tmp_path, vocab_size=len(vocab), pad_token_id=pad, decoder_start_token_id=pad, init_std=0.2)
    with torch.no_grad():
        hf.final_logits_bias[0, 0] += 3.0
    hf.save_pretrained(tmp_path)
    return tmp_path, hf


@pytest.mark.parametrize(
    ("beam", "length"),
    [(1, None), (3, 6)],  # free-length greedy; beam search at a fixed length (see test_decoding.py)
)
def test_translate_command_matches_transformers(opus_mt_dir, tmp_path, beam, length, capsys):
    directory, hf = opus_mt_dir
    (tmp_path / "in.de").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    args = ["translate", "--model", str(directory), "--input", str(tmp_path / "in.de"), "--beam", str(beam),
            "--lenpen", "1.0", "--lenpen-kind", "simple"]  # fmt: skip
    limits = ["--min-len", str(length), "--max-len", str(length)] if length else ["--max-len", "30"]
    assert main(args + limits) == 0
    got = capsys.readouterr().out.splitlines()
    tok = transformers.MarianTokenizer(
        *(str(directory / f) for f in ("source.spm", "target.spm", "vocab.json"))
    )
    real = [line for line in LINES if line]
    batch = tok(real, return_tensors="pt", padding=True)
    limits = dict(max_new_tokens=length, min_new_tokens=length) if length else dict(max_new_tokens=30)
    out = hf.generate(**batch, num_beams=beam, do_sample=False, length_penalty=1.0, **limits)
    ref = iter(tok.batch_decode(out, skip_special_tokens=True))
    assert got == [next(ref) if line else "" for line in LINES]
    assert len(set(got)) > 2


def test_tokenizer_that_does_not_fit_the_model_is_refused(opus_mt_dir):
    directory, _ = opus_mt_dir
    marian(directory, vocab_size=40, pad_token_id=39, decoder_start_token_id=39)
    with pytest.raises(ModelDirError, match="the source vocabulary .* does not fit config.json"):
        load_marian_translation(directory)


def test_a_multilingual_opus_mt_is_evaluated_on_a_language_it_names_by_group(opus_mt_dir, tmp_path, capsys):
    """OPUS-MT names a group ("mul", "ROMANCE") where an aiayn model names its language: --src-lang
    de was refused as a contradiction of "mul"."""
    directory, _ = opus_mt_dir
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(
        json.dumps({**config, "source_lang": "mul", "target_lang": "en"})
    )
    (tmp_path / "s.de").write_text("Ein Mann.\n", encoding="utf-8")
    (tmp_path / "r.en").write_text("A man.\n", encoding="utf-8")
    src, ref = str(tmp_path / "s.de"), str(tmp_path / "r.en")
    argv = ["evaluate", "--model", str(directory), "--src", src, "--ref", ref]
    assert main([*argv, "--src-lang", "de", "--max-len", "5"]) == 0, capsys.readouterr().err
