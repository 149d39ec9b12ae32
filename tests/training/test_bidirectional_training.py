"""A bidirectional model trains through the unchanged loop (both losses logged), resumes bit-exactly,
and translates, evaluates and plots attention from the command line without new flags."""

import json

import pytest

from aiayn.cli.main import main
from tests.training.conftest import tiny_args

ARGS = ["model.bidirectional=true", "eval_every=2", "keep_last=5", "eval_bleu=true", "eval_max_sentences=5"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))


def records(run, split):
    return [
        r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == split
    ]


def test_bidirectional_trains_resumes_exactly_and_translates(corpus, tmp_path, capsys):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", *tiny_args(corpus, straight, "max_steps=6", *ARGS)]) == 0
    assert main(["train", *tiny_args(corpus, split, "max_steps=4", *ARGS)]) == 0
    assert main(["train", *tiny_args(corpus, split, "max_steps=6", *ARGS), "--resume"]) == 0
    train = records(straight, "train")
    assert all("r2l_nll" in r for r in train) and all(
        "r2l_nll" in r and "bleu" in r for r in records(straight, "valid")
    )
    assert [(r["loss"], r["r2l_nll"]) for r in records(split, "train")] == [
        (r["loss"], r["r2l_nll"]) for r in train
    ]
    (tmp_path / "in.txt").write_text("hund läuft\nkatze sitzt rot\n", encoding="utf-8")
    capsys.readouterr()
    assert (
        main(["translate", "--model", str(straight), "--input", str(tmp_path / "in.txt"), "--r2l-beam", "2"])
        == 0
    )
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["evaluate", "--model", str(straight), "--src", str(corpus / "valid.de"), "--ref",
                 str(corpus / "valid.en"), "--beam", "2"]) == 0  # fmt: skip
    assert (
        main(["attention", "--model", str(straight), "--src", "hund läuft", "--out", str(tmp_path / "att")])
        == 0
    )
    assert (tmp_path / "att" / "cross_r2l_layer0.png").is_file() and (
        tmp_path / "att" / "r2l_self_layer0.png"
    ).is_file()
    assert main(["export", "--model", str(straight), "--to", "hf", str(tmp_path / "hf")]) == 1
    assert "bidirectional" in capsys.readouterr().err


def test_reference_memory_trains_and_resumes_exactly(corpus, tmp_path):
    """The other memory (the default, ``greedy``, is the test above)."""
    args = ["model.bidirectional=true", "r2l_memory_from=reference", "eval_every=2", "keep_last=5"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", *tiny_args(corpus, straight, "max_steps=4", *args)]) == 0
    assert main(["train", *tiny_args(corpus, split, "max_steps=2", *args)]) == 0
    assert main(["train", *tiny_args(corpus, split, "max_steps=4", *args), "--resume"]) == 0
    assert [(r["loss"], r["r2l_nll"]) for r in records(split, "train")] == [
        (r["loss"], r["r2l_nll"]) for r in records(straight, "train")
    ]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            ["model.bidirectional=true", "r2l_detach=true", "r2l_weight=0"],
            "leaves the right-to-left decoder untrained",
        ),
        (["model.bidirectional=true", "reverse_target=true"], "choose one"),
        (["model.bidirectional=true", "model.r2l_memory=true"], "r2l_memory"),
        (["r2l_weight=-1"], r"r2l_weight=-1.0 must be ≥ 0"),
        (
            ["r2l_memory_from=beam"],
            r"r2l_memory_from='beam' is not one of \('reference', 'greedy', 'cache'\)",
        ),
    ],
)
def test_bad_bidirectional_configs(overrides, match):
    from aiayn.errors import ConfigError
    from aiayn.training.recipe import load_recipe

    with pytest.raises(ConfigError, match=match):
        load_recipe(None, overrides)
