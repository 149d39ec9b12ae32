"""Training with subword_dropout (BPE-dropout): the pairs are re-segmented each epoch, --resume
across an epoch boundary is exact, and the option is validated."""

import json

import pytest

from aiayn.cli.main import main
from tests.training.conftest import tiny_args

ARGS = ["max_tokens=2048", "eval_every=3", "keep_last=5", "subword_dropout=0.1"]  # ~6 batches an epoch


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))


def _train(run) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == "train"]


def test_resume_across_epochs_is_exact_and_the_segmentation_changes(corpus, tmp_path, capsys):
    ref, run, plain = tmp_path / "ref", tmp_path / "run", tmp_path / "plain"
    assert main(["train", *tiny_args(corpus, ref, "max_steps=14", *ARGS)]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "segmentations" in line]
    assert len(said) == 1 and said[0].startswith(
        "aiayn train: subword_dropout=0.1: 8 segmentations of the training pairs; source: "
    )
    assert "; target: " in said[0] and "deterministic (+" in said[0]  # dropped merges: more pieces
    assert main(["train", *tiny_args(corpus, run, "max_steps=3", *ARGS)]) == 0
    assert main(["train", *tiny_args(corpus, run, "max_steps=14", *ARGS), "--resume"]) == 0
    records = _train(ref)
    assert [(r["step"], r["loss"]) for r in _train(run)] == [(r["step"], r["loss"]) for r in records]
    assert records[-1]["epoch"] >= 2  # the resumed part crossed epoch boundaries
    assert main(["train", *tiny_args(corpus, plain, "max_steps=14", *ARGS[:-1])]) == 0
    assert [r["loss"] for r in _train(plain)] != [r["loss"] for r in records]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["subword_dropout=1.0"], "subword_dropout=1.0 must be in [0, 1)"),
        (["subword_dropout=-0.1"], "subword_dropout=-0.1 must be in [0, 1)"),
        (["task=lm", "subword_dropout=0.1"], "re-segments training texts at random"),
        (["subword_dropout_sides=neither"], "subword_dropout_sides='neither' is not one of"),
        (["subword_dropout_sides=source"], "does nothing while subword_dropout=0"),
    ],
)
def test_subword_dropout_is_validated(corpus, tmp_path, capsys, overrides, message):
    assert main(["train", *tiny_args(corpus, tmp_path / "run", *overrides)]) == 1
    assert message in capsys.readouterr().err
