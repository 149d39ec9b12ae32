"""lowercase=true: a translation run whose vocabulary lowercases all text scores validation BLEU
against lowercased references, translates cased input into lowercased output, and the option is
validated."""

import json

import pytest

from aiayn.cli.main import main
from aiayn.data import load_translation_tokenizers
from aiayn.training.distributed import DistInfo
from aiayn.training.recipe import load_recipe
from aiayn.training.tasks.translation import TranslationTask
from tests.training.conftest import tiny_args


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def cased(corpus):
    """The tiny corpus with case to lose: every sentence capitalised, every third one in capitals."""
    for path in corpus.iterdir():
        lines = path.read_text(encoding="utf-8").splitlines()
        lines = [s.upper() if i % 3 == 0 else s.capitalize() for i, s in enumerate(lines)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return corpus


@pytest.mark.parametrize("lowercase", [True, False])
def test_validation_references_follow_the_vocabulary(cased, tmp_path, lowercase):
    overrides = ["vocab_size=400", f"lowercase={str(lowercase).lower()}"]
    cfg = load_recipe(None, tiny_args(cased, tmp_path / "run", *overrides))
    task = TranslationTask(cfg, tmp_path / "run", DistInfo())
    refs = (cased / "valid.en").read_text(encoding="utf-8").splitlines()
    assert task.tgt_tok.lowercase is task.src_tok.lowercase is lowercase
    assert task.valid_refs == ([r.lower() for r in refs] if lowercase else refs)
    assert any(r != r.lower() for r in refs)  # there was case to lose


def test_a_lowercase_model_translates_cased_input_into_lowercased_text(cased, tmp_path, capsys):
    run = tmp_path / "run"
    args = tiny_args(cased, run, "vocab_size=400", "max_steps=150", "lowercase=true", "eval_every=150")
    assert main(["train", *args]) == 0
    src_tok, tgt_tok = load_translation_tokenizers(run / "tokenizer")
    assert src_tok.encode("HUND Katze") == src_tok.encode("hund katze")
    src = tmp_path / "in.de"
    src.write_text("HUND KATZE ROT\nMann Läuft\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["translate", "--model", str(run / "best"), "--input", str(src), "--beam", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line == line.lower() and line.strip() for line in out)
    report = tmp_path / "scores.json"
    evaluate = ["evaluate", "--model", str(run / "best"), "--src", str(cased / "valid.de"), "--ref",
                str(cased / "valid.en"), "--beam", "1", "--json", str(report)]  # fmt: skip
    assert main(evaluate) == 0
    assert "the model writes lowercased text" in capsys.readouterr().out
    scores = json.loads(report.read_text())
    assert scores["lowercase"] is True and scores["bleu"] < scores["bleu_lc"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task=lm", "tokenizer=char", "lowercase=true"], "is for a translation model's subword vocabulary"),
        (["tokenizer=char", "lowercase=true"], "tokenizer='char' does not take it"),
    ],
)
def test_lowercase_is_validated(corpus, tmp_path, capsys, overrides, message):
    assert main(["train", *tiny_args(corpus, tmp_path / "run", *overrides)]) == 1
    assert message in capsys.readouterr().err
