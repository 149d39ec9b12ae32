"""scripts/encoder_runs.py: the IMDb masked-LM encoder is trained once and reused while its recipe,
data and overrides are unchanged; test predictions are one label per test row, in order."""

import gzip
import sys
from pathlib import Path

import pytest

from aiayn.training.recipe import load_recipe
from aiayn.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import encoder_runs  # noqa: E402


@pytest.fixture
def imdb(tmp_path):
    folder = tmp_path / "imdb"
    folder.mkdir()
    (folder / "unsup.txt.gz").write_bytes(gzip.compress(b"a review\n"))
    (folder / "dev.tsv.gz").write_bytes(gzip.compress(b"label\ttext\n1\tgood\n"))
    return folder


def test_pretraining_is_reused_until_its_recipe_data_or_overrides_change(imdb, tmp_path, monkeypatch):
    calls = []

    def fake_train(recipe, run_dir, overrides, metric="accuracy"):
        calls.append(overrides)
        run_dir.mkdir(parents=True, exist_ok=True)
        return {"minutes": 1.5, "valid_curve": [{"accuracy": 20.0}, {"accuracy": 30.0}]}

    monkeypatch.setattr(encoder_runs, "train", fake_train)
    monkeypatch.setattr(encoder_runs, "RUNS", tmp_path / "runs")
    first = encoder_runs.pretrain(imdb)
    assert not first["reused"] and first["masked_token_accuracy"] == 30.0 and len(calls) == 1
    assert calls[0][:2] == [f"dataset={imdb.resolve() / 'unsup.txt.gz'}",
                            f"valid_dataset={imdb.resolve() / 'dev.tsv.gz'}"]  # fmt: skip
    again = encoder_runs.pretrain(imdb)
    assert again["reused"] and again["minutes"] == 1.5 and len(calls) == 1  # not trained twice
    assert not encoder_runs.pretrain(imdb, ["max_minutes=5"])["reused"] and len(calls) == 2
    other = tmp_path / "other"
    other.mkdir()
    for name in ("unsup.txt.gz", "dev.tsv.gz"):
        (other / name).write_bytes((imdb / name).read_bytes())
    assert not encoder_runs.pretrain(other)["reused"] and len(calls) == 3  # other data: trained again
    with pytest.raises(SystemExit, match=r"unsup.txt.gz: not found"):
        encoder_runs.pretrain(tmp_path)


def test_published_predictions_are_the_models_labels_in_test_order(tmp_path, monkeypatch):
    rows = ["text\tlabel"] + [f"{'great film' if i % 2 else 'dull film'} {i}\t{i % 2}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    Trainer(load_recipe(None, ["task=classify", f"dataset={tmp_path / 'train.tsv'}", f"out_dir={run}",
                               "vocab_size=300", "max_tokens=256", "model.d_model=16", "model.n_heads=2",
                               "model.d_ff=32", "model.n_layers=1", "model.dropout=0", "max_steps=60",
                               "eval_every=60", "schedule=constant", "lr=0.003", "warmup=5",
                               "progress=false", "threads=1"])).fit()  # fmt: skip
    test = tmp_path / "test.tsv"
    test.write_text("text\ngreat film\ndull film\ngreat film\n", encoding="utf-8")
    monkeypatch.setattr(encoder_runs, "ROOT", tmp_path)  # the record names files relative to the root
    for name, read in (
        ("p.txt", Path.read_text),
        ("p.txt.gz", lambda p: gzip.decompress(p.read_bytes()).decode()),
    ):
        record = encoder_runs.publish_predictions(run, test, tmp_path / name, "text")
        assert read(tmp_path / name) == "1\n0\n1\n"
        assert record == {"file": name, "rows": 3, "model": "run"}


def test_each_pretraining_objective_has_its_recipe_run_and_figure(imdb, tmp_path, monkeypatch):
    calls = []

    def fake_train(recipe, run_dir, overrides, metric="accuracy"):
        calls.append((recipe, run_dir.name, overrides, metric))
        run_dir.mkdir(parents=True, exist_ok=True)
        return {"minutes": 1.0, "valid_curve": [{metric: 40.0}], "run_dir": f"runs/{run_dir.name}"}

    monkeypatch.setattr(encoder_runs, "train", fake_train)
    monkeypatch.setattr(encoder_runs, "RUNS", tmp_path / "runs")
    assert encoder_runs.pretrain(imdb, objective="rtd")["detection_f1"] == 40.0
    assert calls[-1][:2] == ("imdb-rtd", "imdb-rtd") and calls[-1][3] == "f1"
    assert encoder_runs.pretrain(imdb, objective="clm")["next_piece_accuracy"] == 40.0
    assert calls[-1][:2] == ("imdb-clm", "imdb-clm") and calls[-1][3] == "accuracy"
    with pytest.raises(SystemExit, match=r"train.tsv.gz: not found"):
        encoder_runs.pretrain(imdb, objective="sentiment")  # supervised: needs the labelled reviews
    (imdb / "train.tsv.gz").write_bytes(gzip.compress(b"label\ttext\n0\tbad\n"))
    assert encoder_runs.pretrain(imdb, objective="sentiment")["imdb_dev_accuracy"] == 40.0
    recipe, run, overrides, _ = calls[-1]
    assert (recipe, run) == ("imdb-finetune", "imdb-sentiment")
    assert overrides[:3] == [f"dataset={imdb.resolve()}", "init_from=", "lowercase=true"]
    assert encoder_runs.pretrain(imdb, objective="sentiment")["reused"] and len(calls) == 3


def test_clm_then_sentiment_starts_from_the_causal_lm_and_counts_both_stages(imdb, tmp_path, monkeypatch):
    calls = []

    def fake_train(recipe, run_dir, overrides, metric="accuracy"):
        calls.append((recipe, run_dir.name, overrides))
        run_dir.mkdir(parents=True, exist_ok=True)
        return {"minutes": 2.0 if recipe == "imdb-clm" else 1.0, "valid_curve": [{metric: 40.0}],
                "run_dir": f"runs/{run_dir.name}"}  # fmt: skip

    monkeypatch.setattr(encoder_runs, "train", fake_train)
    monkeypatch.setattr(encoder_runs, "RUNS", tmp_path / "runs")
    (imdb / "train.tsv.gz").write_bytes(gzip.compress(b"label\ttext\n0\tbad\n"))
    record = encoder_runs.pretrain(imdb, objective="clm-sentiment")
    assert [c[:2] for c in calls] == [("imdb-clm", "imdb-clm"), ("imdb-finetune", "imdb-clm-sentiment")]
    clm = encoder_runs.ROOT / "runs/imdb-clm"
    minutes = encoder_runs.CLM_SENTIMENT_MINUTES
    # the causal LM's own tokenizer (lowercase=true with init_from is a config error)
    assert calls[1][2][:3] == [f"dataset={imdb.resolve()}", f"init_from={clm}", f"max_minutes={minutes}"]
    assert (record["minutes"], record["stage_minutes"], record["first_stage"]) == (3.0, 1.0, "runs/imdb-clm")
    assert encoder_runs.pretrain(imdb, objective="clm-sentiment")["reused"] and len(calls) == 2
    # another first stage, then the recipe's again: the second stage is retrained as well
    assert not encoder_runs.pretrain(imdb, ["max_minutes=5"], objective="clm")["reused"]
    assert not encoder_runs.pretrain(imdb, objective="clm-sentiment")["reused"]
    assert [c[1] for c in calls[2:]] == ["imdb-clm", "imdb-clm", "imdb-clm-sentiment"]


def test_sst2_arms_differ_only_where_the_pretrained_arm_says(tmp_path):
    """reproduce_sst2's two arms: the clm-sentiment encoder is fine-tuned at half the recipe's
    learning rate, in its own run directories; the scratch arm, and every other objective's
    fine-tuned arm, keep the recipe's. Results of a seed run with other fields are not merged."""
    import json

    import reproduce_sst2

    recipe = load_recipe(ROOT / "recipes/sst2-finetune.toml")
    pretrained = tmp_path / "encoder"
    for objective in ("mlm", "clm", "sentiment", "clm-sentiment"):
        arms = reproduce_sst2.arms(objective, pretrained, tmp_path)
        finetune = load_recipe(ROOT / "recipes/sst2-finetune.toml", arms["finetune"][1])
        scratch = load_recipe(ROOT / "recipes/sst2-finetune.toml", arms["scratch"][1])
        assert (finetune.options.init_from, scratch.options.init_from) == (str(pretrained), "")
        assert scratch.lr == recipe.lr and arms["scratch"][0] == "scratch"
        halved = objective == "clm-sentiment"
        assert finetune.lr == (recipe.lr / 2 if halved else recipe.lr)
        assert arms["finetune"][0] == ("finetune-lr1.5e-4" if halved else "finetune")
    arms = {kind: o for kind, (_, o) in reproduce_sst2.arms("clm-sentiment", pretrained, tmp_path).items()}
    old = [{"kind": kind, "seed": 1, "overrides": [*o, "seed=1"]} for kind, o in arms.items()]
    old.append(
        {
            "kind": "finetune",
            "seed": 1,
            "overrides": [*arms["scratch"][:-1], f"init_from={pretrained}", "seed=1"],
        }
    )
    path = tmp_path / "sst2.json"
    path.write_text(json.dumps({"pretraining": {"run_dir": "runs/x"}, "runs": old}))
    assert reproduce_sst2.earlier_runs({"run_dir": "runs/x"}, [2], path, arms) == old[:2]
    assert reproduce_sst2.earlier_runs({"run_dir": "runs/x"}, [1], path, arms) == []
    assert reproduce_sst2.earlier_runs({"run_dir": "runs/y"}, [2], path, arms) == []
    retrained = {"run_dir": "runs/x", "key": "k2", "minutes": 30.0}  # another encoder in the same directory
    assert reproduce_sst2.earlier_runs(retrained, [2], path, arms) == []


def test_a_precision_holds_for_every_stage_and_arm_and_names_its_own_runs(imdb, tmp_path, monkeypatch):
    """--precision bf16: both pre-training stages (the causal LM and IMDb's labels after it) and both
    SST-2 arms train under it, in run directories of their own; fp32 (the recipes') adds nothing, so
    the default runs keep their names and their reuse keys."""
    import reproduce_sst2

    calls = []

    def fake_train(recipe, run_dir, overrides, metric="accuracy"):
        calls.append((run_dir.name, overrides))
        run_dir.mkdir(parents=True, exist_ok=True)
        return {"minutes": 1.0, "valid_curve": [{metric: 40.0}], "run_dir": f"runs/{run_dir.name}"}

    monkeypatch.setattr(encoder_runs, "train", fake_train)
    monkeypatch.setattr(encoder_runs, "RUNS", tmp_path / "runs")
    (imdb / "train.tsv.gz").write_bytes(gzip.compress(b"label\ttext\n0\tbad\n"))
    encoder_runs.pretrain(imdb, objective="clm-sentiment", precision="bf16")
    assert [name for name, _ in calls] == ["imdb-clm-bf16", "imdb-clm-sentiment-bf16"]
    assert all(overrides[-1] == "precision=bf16" for _, overrides in calls)
    assert encoder_runs.pretrain(imdb, objective="clm-sentiment", precision="bf16")["reused"]
    encoder_runs.pretrain(imdb, objective="clm")
    assert calls[-1][0] == "imdb-clm" and not any(o.startswith("precision=") for o in calls[-1][1])
    pretrained = tmp_path / "encoder"
    for kind, (_, overrides) in reproduce_sst2.arms("clm-sentiment", pretrained, tmp_path, "bf16").items():
        assert load_recipe(ROOT / "recipes/sst2-finetune.toml", overrides).precision == "bf16", kind
    for kind, (_, overrides) in reproduce_sst2.arms("clm-sentiment", pretrained, tmp_path).items():
        assert load_recipe(ROOT / "recipes/sst2-finetune.toml", overrides).precision == "fp32", kind


def test_a_dropout_holds_for_both_arms_and_the_recipe_default_adds_nothing(tmp_path):
    """--dropout 0.2 changes both SST-2 arms' dropout, not one of them (the comparison stays one of
    starting points) and keeps their names; without it the recipe's 0.1 holds."""
    import reproduce_sst2

    pretrained = tmp_path / "encoder"
    default = reproduce_sst2.arms("clm-sentiment", pretrained, tmp_path, "bf16")
    changed = reproduce_sst2.arms("clm-sentiment", pretrained, tmp_path, "bf16", 0.2)
    assert [infix for infix, _ in changed.values()] == [infix for infix, _ in default.values()]
    for kind in ("finetune", "scratch"):
        recipe = ROOT / "recipes/sst2-finetune.toml"
        assert load_recipe(recipe, changed[kind][1]).model["dropout"] == 0.2, kind
        assert load_recipe(recipe, default[kind][1]).model["dropout"] == 0.1, kind


def test_max_steps_ends_both_arms_schedules_and_the_default_keeps_the_budget(tmp_path):
    """--max-steps 1000 ends both SST-2 arms' cosine by that update (the budget still bounds it, as
    horizon='budget' reads the first of the two), not one arm's; without it the recipe's cap holds."""
    import reproduce_sst2

    recipe = ROOT / "recipes/sst2-finetune.toml"
    default = reproduce_sst2.arms("clm-sentiment", tmp_path / "encoder", tmp_path, "bf16", 0.2)
    changed = reproduce_sst2.arms("clm-sentiment", tmp_path / "encoder", tmp_path, "bf16", 0.2, 1000)
    for kind in ("finetune", "scratch"):
        cfg = load_recipe(recipe, changed[kind][1])
        assert (cfg.max_steps, cfg.horizon, cfg.max_minutes) == (1000, "budget", 15), kind
        assert load_recipe(recipe, default[kind][1]).max_steps == load_recipe(recipe).max_steps == 4000, kind
