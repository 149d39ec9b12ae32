"""``aiayn evaluate``: sacreBLEU BLEU and chrF (cased and lowercased), signatures, JSON, errors;
tokenized BLEU as papers on Multi30k's tokenised files report it."""

import json

import pytest
from sacrebleu.metrics import BLEU

from aiayn.cli.evaluate import moses_lc_tokenize, tokenized_bleu
from aiayn.cli.main import main

# Lines 2, 457 and 792 of test2016 (German): raw, and as Multi30k's own preprocessing wrote them with
# the Moses perl scripts (GitHub multi30k/dataset, data/task1/tok/test_2016_flickr.lc.norm.tok.de).
MULTI30K_TOK = [
    ("Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
     "ein boston terrier läuft über saftig-grünes gras vor einem weißen zaun ."),
    ('Eine Frau hält einen großen Scheck für "Kids\' Food Basket".',
     "eine frau hält einen großen scheck für &quot; kids &apos; food basket &quot; ."),
    ("Zwei Jungen essen ihr McDonald's-Menü im Außenbereich, umgeben von vielen anderen Leuten.",
     "zwei jungen essen ihr mcdonald &apos; s-menü im außenbereich , umgeben von vielen anderen leuten ."),
]  # fmt: skip


def test_scores_files_and_writes_json(model_dirs, tmp_path, capsys):
    src, ref = tmp_path / "t.de", tmp_path / "t.en"
    src.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde\n", encoding="utf-8")
    ref.write_text("A man rides a bike.\nTwo dogs\n", encoding="utf-8")
    hyp, report = tmp_path / "hyp.en", tmp_path / "scores.json"
    args = ["evaluate", "--model", str(model_dirs["joint"]), "--src", str(src), "--ref", str(ref)]
    assert main([*args, "--beam", "2", "--output", str(hyp), "--json", str(report), "--tokenized-bleu"]) == 0
    out = capsys.readouterr().out
    assert "BLEU" in out and "chrF" in out and "nrefs:1|case:mixed" in out and "case:lc" not in out
    assert "lowercased Moses tokens" in out
    figures = json.loads(report.read_text())
    hyps, refs = hyp.read_text(encoding="utf-8").splitlines(), ["A man rides a bike.", "Two dogs"]
    assert figures["bleu"] == pytest.approx(BLEU().corpus_score(hyps, [refs]).score, abs=0.01)
    assert {"bleu_lc", "chrf", "chrf_lc", "signatures"} <= set(figures) and figures["search"]["beam"] == 2
    assert (figures["bleu_tok_lc"], figures["signatures"]["bleu_tok_lc"]) == tokenized_bleu(hyps, refs, "en")


def test_bleu_is_tokenized_for_the_target_language_as_sacrebleu_does():
    """``sacrebleu -l en-zh`` tokenizes Chinese with its ``zh`` tokenizer; 13a (used for every target
    before) sees one token per run of characters and scores a near-perfect translation 0."""
    from aiayn.cli.evaluate import score
    from aiayn.decoding.bleu import bleu

    hyps, refs = ["我今天很喜欢吃苹果和香蕉"], ["我今天很喜欢吃苹果和橘子"]
    expected = BLEU(tokenize="zh").corpus_score(hyps, [refs]).score
    assert expected > 50 and BLEU().corpus_score(hyps, [refs]).score == 0
    scores, signatures = score(hyps, refs, tgt_lang="zh")
    assert scores["bleu"] == round(expected, 2) and "tok:zh" in signatures["bleu"]
    assert "tok:13a" in str(score(hyps, refs, tgt_lang="en")[1]["bleu"])
    assert bleu("de").corpus_score(hyps, [refs]).score == 0  # 13a for the rest


def test_a_target_language_whose_bleu_tokenizer_is_missing_is_one_line(monkeypatch):
    import sacrebleu.tokenizers.tokenizer_ja_mecab as mecab

    from aiayn.decoding.bleu import bleu
    from aiayn.errors import ConfigError

    monkeypatch.setattr(mecab, "MeCab", None)  # as sacreBLEU finds it without its ja extra
    with pytest.raises(ConfigError, match=r"target language 'ja' .*: pip install 'sacrebleu\[ja\]'"):
        bleu("ja")


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
    ref.write_text("a\nb\n", encoding="utf-8")
    files = ["--src", str(src), "--ref", str(ref), "--output", str(tmp_path / "out.en")]
    assert main(["evaluate", "--model", str(model_dirs["joint"]), *files, "--beam", "3", "--nbest", "3"]) == 1
    assert "--nbest 3: evaluate scores each sentence's best translation" in capsys.readouterr().err


def test_a_missing_sacremoses_is_said_before_any_decoding(model_dirs, tmp_path, monkeypatch, capsys):
    import sys

    import aiayn.decoding.translator

    monkeypatch.setitem(sys.modules, "sacremoses", None)  # as if not installed
    decoded = []
    monkeypatch.setattr(aiayn.decoding.translator.Translator, "translate", lambda *a, **k: decoded.append(1))
    src, ref = tmp_path / "t.de", tmp_path / "t.en"
    src.write_text("a\n", encoding="utf-8")
    ref.write_text("a\n", encoding="utf-8")
    args = ["evaluate", "--model", str(model_dirs["joint"]), "--src", str(src), "--ref", str(ref),
            "--tokenized-bleu", "--output", str(tmp_path / "out.en")]  # fmt: skip
    assert main(args) == 1
    assert "--tokenized-bleu needs sacremoses" in capsys.readouterr().err
    assert not decoded and not (tmp_path / "out.en").exists()


def test_multi30k_test_split(model_dirs, capsys):
    assert main(["evaluate", "--model", str(model_dirs["joint"]), "--beam", "1", "--max-len-b", "5"]) == 0
    assert "multi30k.test.de-en: 1000 sentences" in capsys.readouterr().out


def test_moses_lc_tokenize_reproduces_multi30k_tokenised_files():
    raw, tokenised = (list(side) for side in zip(*MULTI30K_TOK))
    assert moses_lc_tokenize(raw, "de") == tokenised


def test_tokenized_bleu_by_hand():
    # After lowercasing and tokenisation, 9 words each and one wrong: n-gram precisions 8/9, 6/8, 5/7,
    # 4/6, lengths equal (no brevity penalty). Unsplit, "Rad." and "Fahrrad." would be one word each.
    hyp, ref = "Ein Mann in einem roten Hemd fährt Rad.", "ein Mann in einem roten Hemd fährt Fahrrad."
    figure, signature = tokenized_bleu([hyp], [ref], "de")
    assert figure == pytest.approx(100 * (8 * 6 * 5 * 4 / (9 * 8 * 7 * 6)) ** 0.25, abs=0.005)
    assert "tok:none" in signature and "moses-lc-norm-tok:de" in signature
