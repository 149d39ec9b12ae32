"""r_drop: a translation run with R-Drop's consistency term trains, logs per-pass losses, resumes
exactly, and the option is validated."""

import json

import pytest

from aiayn.cli.main import main
from tests.training.conftest import tiny_args


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))


def _records(run, split):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def test_r_drop_trains_resumes_exactly_and_adds_the_consistency_term(corpus, tmp_path):
    ref, run, plain = tmp_path / "ref", tmp_path / "run", tmp_path / "plain"
    args = ["r_drop=5.0", "output_vocab=target", "eval_every=4", "model.dropout=0.3"]
    assert main(["train", *tiny_args(corpus, ref, "max_steps=8", *args)]) == 0
    assert main(["train", *tiny_args(corpus, run, "max_steps=3", *args)]) == 0
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", *args), "--resume"]) == 0
    assert [(r["step"], r["loss"]) for r in _records(run, "train")] == [
        (r["step"], r["loss"]) for r in _records(ref, "train")
    ]
    assert main(["train", *tiny_args(corpus, plain, "max_steps=1", *args[1:])]) == 0
    first, first_plain = _records(ref, "train")[0], _records(plain, "train")[0]
    # step 1, same weights: the NLL is the two passes' mean, and the loss adds α · KL on top
    assert abs(first["nll"] - first_plain["nll"]) < 0.05 * first_plain["nll"]
    assert first["loss"] - first["nll"] > first_plain["loss"] - first_plain["nll"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["r_drop=-1"], "r_drop=-1.0 must be ≥ 0"),
        (["r_drop=nan"], "r_drop=nan must be a finite number"),
        (["task=lm", "tokenizer=char", "r_drop=1"], "is R-Drop for translation models and classifiers"),
        (["r_drop=1", "model.bidirectional=true"], "R-Drop is not implemented for the right-to-left decoder"),
    ],
)
def test_r_drop_is_validated(corpus, tmp_path, capsys, overrides, message):
    assert main(["train", *tiny_args(corpus, tmp_path / "run", *overrides)]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
