"""output_vocab="target": the output layer scores only the pieces of the training targets, the
model saves, resumes, averages and translates with them, and the option is validated."""

import json

import numpy as np
import pytest
import torch

from aiayn.cli.main import main
from aiayn.data import encode_parallel, load_parallel, load_translation_tokenizers
from aiayn.data.corpus import CorpusFilter
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.translator import Translator
from aiayn.models.io import load_model
from tests.training.conftest import tiny_args

ARGS = ["output_vocab=target", "eval_every=4", "keep_last=3"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))


def _train(run) -> list[tuple[int, float]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines) if r["split"] == "train"]


def test_the_model_scores_the_target_pieces_and_resumes_exactly(corpus, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert main(["train", *tiny_args(corpus, ref, "max_steps=12", *ARGS)]) == 0
    assert main(["train", *tiny_args(corpus, run, "max_steps=5", *ARGS)]) == 0
    assert main(["train", *tiny_args(corpus, run, "max_steps=12", *ARGS), "--resume"]) == 0
    assert _train(run) == _train(ref)

    src_tok, tgt_tok = load_translation_tokenizers(ref / "tokenizer")
    train = load_parallel(str(corpus), "train", "de", "en")
    encoded = encode_parallel(train, src_tok, tgt_tok, CorpusFilter(max_len=256))
    seen = set(np.unique(encoded.tgt.ids).tolist()) | {tgt_tok.eos_id, tgt_tok.unk_id}
    model = load_model(ref)
    assert model.config.output_pieces == len(seen) < tgt_tok.vocab_size  # the German pieces are gone
    assert model.head.pieces.tolist() == sorted(seen)

    sources, _ = (translator := Translator(model, src_tok, tgt_tok)).encode(["hund katze rot", "mann läuft"])
    searches = [SearchConfig(beam=1), SearchConfig(beam=4, nbest=4)]
    searches.append(SearchConfig(beam=1, sample=True, temperature=5.0, nbest=3))  # any id could come up
    for search in searches:
        torch.manual_seed(0)
        for hyps in translator.search(sources, search):
            assert {i for h in hyps for i in h.tokens} <= seen, search

    averaged = tmp_path / "avg"
    assert main(["average", str(ref), "--last", "3", "--out", str(averaged)]) == 0
    assert torch.equal(load_model(averaged).head.pieces, model.head.pieces)


def test_plain_runs_score_every_id(corpus, tmp_path):
    assert main(["train", *tiny_args(corpus, tmp_path / "run", "max_steps=1")]) == 0
    model = load_model(tmp_path / "run")
    assert model.config.output_pieces == 0 and model.head.pieces is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["output_vocab=source"], "output_vocab='source' is not one of"),
        (["task=lm", "tokenizer=char", "output_vocab=target"], "picks a translation model's output ids"),
        (["model.output_pieces=10"], "model.output_pieces is set from the training data"),
    ],
)
def test_output_vocab_is_validated(corpus, tmp_path, capsys, overrides, message):
    assert main(["train", *tiny_args(corpus, tmp_path / "run", *overrides)]) == 1
    assert message in capsys.readouterr().err
