"""``aiayn evaluate``: sacreBLEU BLEU and chrF (cased and lowercased), signatures, JSON, errors."""

import json

import pytest
from sacrebleu.metrics import BLEU

from aiayn.cli.main import main


def test_scores_files_and_writes_json(model_dirs, tmp_path, capsys):
    src, ref = tmp_path / "t.de", tmp_path / "t.en"
    src.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde\n", encoding="utf-8")
    ref.write_text("A man rides a bike.\nTwo dogs\n", encoding="utf-8")
    hyp, report = tmp_path / "hyp.en", tmp_path / "scores.json"
    args = ["evaluate", "--model", str(model_dirs["joint"]), "--src", str(src), "--ref", str(ref)]
    assert main([*args, "--beam", "2", "--output", str(hyp), "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "BLEU" in out and "chrF" in out and "nrefs:1|case:mixed" in out and "case:lc" not in out
    figures = json.loads(report.read_text())
    hyps = hyp.read_text(encoding="utf-8").splitlines()
    expected = BLEU().corpus_score(hyps, [["A man rides a bike.", "Two dogs"]]).score
    assert figures["bleu"] == pytest.approx(expected, abs=0.01)
    assert {"bleu_lc", "chrf", "chrf_lc", "signatures"} <= set(figures) and figures["search"]["beam"] == 2


def test_errors(model_dirs, tmp_path, capsys):
    src = tmp_path / "t.de"
    src.write_text("a\nb\n", encoding="utf-8")
    assert main(["evaluate", "--model", str(model_dirs["joint"]), "--src", str(src)]) == 1
    assert "give both --src and --ref" in capsys.readouterr().err
    ref = tmp_path / "t.en"
    ref.write_text("a\n", encoding="utf-8")
    assert main(["evaluate", "--model", str(model_dirs["joint"]), "--src", str(src), "--ref", str(ref)]) == 1
    assert "has 2 lines but" in capsys.readouterr().err
    assert main(["evaluate", "--model", str(model_dirs["lm"])]) == 1
    assert "this command needs a translation model" in capsys.readouterr().err


def test_multi30k_test_split(model_dirs, capsys):
    assert main(["evaluate", "--model", str(model_dirs["joint"]), "--beam", "1", "--max-len-b", "5"]) == 0
    assert "multi30k.test.de-en: 1000 sentences" in capsys.readouterr().out
