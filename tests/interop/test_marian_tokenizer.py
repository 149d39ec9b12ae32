"""An exported translation model is complete for transformers: ``AutoTokenizer`` (MarianTokenizer) +
``MarianMTModel.generate`` give aiayn's ids, greedy output and detokenized text."""

import gzip

import pytest
import torch

transformers = pytest.importorskip("transformers")

from aiayn import Transformer, TransformerConfig  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.data import SentencePieceTokenizer, data_dir  # noqa: E402
from aiayn.decoding.options import SearchConfig  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402
from aiayn.interop.hf import SINUSOID_ROWS  # noqa: E402
from aiayn.interop.model_dir import model_meta  # noqa: E402
from aiayn.models.io import save_model  # noqa: E402

SENTENCES = ["Ein Mann fährt ein Fahrrad über die Straße.", "Zwei Hunde spielen im Schnee!", "東京 ist groß."]


@pytest.mark.parametrize("joint", [True, False])
def test_marian_tokenizer_and_generate_match_aiayn(joint, tmp_path):
    def read(name):
        with gzip.open(data_dir() / "multi30k" / name, "rt", encoding="utf-8") as f:
            return f.read().splitlines()[:2000]

    de, en = read("train.de.gz"), read("train.en.gz")
    src = SentencePieceTokenizer.train(de + en if joint else de, 1000)
    tgt = src if joint else SentencePieceTokenizer.train(en, 900)
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(src_vocab_size=src.vocab_size, tgt_vocab_size=tgt.vocab_size,
                                          share_embeddings=joint, n_encoder_layers=2, n_decoder_layers=2,
                                          d_model=32, n_heads=4, d_ff=64, dropout=0.0,
                                          max_len=64)).eval()  # fmt: skip
    save_model(model, tmp_path / "model", src_lang="de", tgt_lang="en")
    if joint:
        src.save(tmp_path / "model")
    else:
        src.save(tmp_path / "model" / "src")
        tgt.save(tmp_path / "model" / "tgt")
    assert main(["export", "--model", str(tmp_path / "model"), "--to", "hf", str(tmp_path / "hf")]) == 0
    # the languages come back from the tokenizer's config (evaluate and serve read them)
    meta = model_meta(tmp_path / "hf")
    assert (meta.get("src_lang"), meta.get("tgt_lang")) == ("de", "en")
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf_model = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    ours = Translator(model, src, tgt)
    for s in SENTENCES:
        ids = hf_tok(s, return_tensors="pt").input_ids
        assert ids[0].tolist() == src.encode(s) + [2], s
        generated = hf_model.generate(ids, num_beams=1, do_sample=False, max_new_tokens=12)[0].tolist()
        hyp = ours.search([src.encode(s)], SearchConfig(beam=1, max_len=12))[0][0]
        assert generated == [1, *hyp.tokens]
        assert hf_tok.decode(generated, skip_special_tokens=True) == ours.detokenize(hyp)
    # the export's position table bounds both: truncation cuts there, and generate may go that far (not
    # transformers' default of 20 tokens); aiayn's sinusoids go past the model's max_len of 64, and so
    # does the table (a max_len of 8 cut every longer sentence in transformers)
    rows = hf_model.config.max_position_embeddings
    assert rows == SINUSOID_ROWS and hf_tok.model_max_length == hf_model.generation_config.max_length == rows
    long = hf_tok(" ".join(SENTENCES * 200), truncation=True, return_tensors="pt").input_ids
    assert long.size(1) == rows
    with torch.no_grad():
        hf_model(input_ids=long, decoder_input_ids=long[:, :5])  # every position is in the table
