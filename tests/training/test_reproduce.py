"""scripts/reproduce.py's members (``--members N``): N models trained side by side in their own
processes, and the candidates the validation set chooses among, their ensembles included."""

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.decoding.options import SearchConfig
from aiayn.errors import ConfigError
from aiayn.models.ensemble import Ensemble
from aiayn.training.recipe import load_recipe
from tests.training.conftest import tiny_args

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "reproduce.py"


def load_script(name: str = "reproduce"):
    spec = importlib.util.spec_from_file_location(name, SCRIPT.with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args, message",
    [
        (["multi30k-en-de", "--members", "1"], "--members 1: give 2 or more"),
        (["shakespeare-char", "--members", "2"], "--members is for translation recipes"),
        (["multi30k-en-de", "--tag", "../elsewhere"], "--tag '../elsewhere': use letters"),
        (["multi30k-en-de", "--average", "0"], "--average 0, --beam 5, --mbr-beam 0: give"),
        (["multi30k-en-de", "--beam", "0"], "--beam 0"),
        (["multi30k-en-de", "--mbr-beam", "-1"], "--mbr-beam -1"),
        (["multi30k-en-de", "--rerank-with", "no/such/run"], "--rerank-with no/such/run: give a model"),
        (["multi30k-en-de", "valid_dataset=corpora/dev"],  # before: refused after training, at writing
         "the name made from the overrides, 'multi30k-en-de-valid_datasetcorpora/dev', cannot name a file: "
         "give --name NAME"),
    ],
)  # fmt: skip
def test_arguments_are_checked_before_anything_runs(args, message):
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2
    assert message in run.stderr


def test_reranking_needs_a_beam_to_re_sort(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    args = ["multi30k-en-de", "--rerank-with", str(tmp_path), "--beam", "1"]
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)  # fmt: skip
    assert run.returncode == 2 and f"--rerank-with {tmp_path}: give a model directory" in run.stderr
    assert "--beam ≥ 2" in run.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["no-such-recipe"], "recipes/no-such-recipe.toml does not exist"),
        (["multi30k-de-en", "lrr=1"], "unknown key 'lrr'"),
    ],
)
def test_a_wrong_recipe_or_override_is_one_line(args, message):
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 1 and run.stderr.startswith("reproduce.py: error: "), run.stderr
    assert message in run.stderr and run.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "script, args, message",
    [
        ("reproduce_bidirectional", ["multi30k-de-en", "--final", "r2l_memory_dropout=1.5"],
         "r2l_memory_dropout=1.5 must be in [0, 1)"),
        ("reproduce_bidirectional", ["multi30k-de-en", "--r2l", "lrr=1"], "unknown key 'lrr'"),
        ("reproduce_bidirectional", ["no-such-recipe"], "recipes/no-such-recipe.toml does not exist"),
        ("reproduce_bidirectional", ["multi30k-de-en", "--rerank", "--jackknife"], "--rerank reads one"),
        ("reproduce_bidirectional", ["multi30k-de-en", "--members", "1"], "--members 1: give 2 or more"),
        ("reproduce_imdb", ["IMDB", "sed=2"], "unknown key 'sed'"),
        ("reproduce_imdb", ["IMDB", "vocab_size=100"], "vocab_size=100 does nothing: init_from="),
        ("reproduce_imdb", ["IMDB", "valid_dataset=a/b"], "valid_dataseta/b', cannot name a file"),
        ("reproduce_sst2", ["SST2", "IMDB", "--dropout", "1.5"], "--dropout 1.5: give a probability"),
    ],
)  # fmt: skip
def test_the_pipelines_check_every_stage_before_the_first_trains(script, args, message, tmp_path):
    """A later stage's mistake is found in a second, not after an hour of the stages before it (nor
    after an earlier run was deleted): nothing is trained and runs/ is left as it was."""
    (tmp_path / "IMDB").mkdir()
    (tmp_path / "IMDB" / "train.tsv.gz").write_bytes(b"")  # the folder's check passes; nothing reads it
    (tmp_path / "SST2").mkdir()
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / "SST2" / name).write_text("label\tsentence\n1\ta\n")
    args = [str(tmp_path / a) if a in ("IMDB", "SST2") else a for a in args]
    runs = sorted((ROOT / "runs").glob("*")) if (ROOT / "runs").is_dir() else []
    done = subprocess.run([sys.executable, str(SCRIPT.with_name(f"{script}.py")), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode in (1, 2) and message in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]  # argparse's usage lines may come before it
    assert message in last and "Traceback" not in done.stderr and "aiayn train:" not in done.stderr
    assert (sorted((ROOT / "runs").glob("*")) if (ROOT / "runs").is_dir() else []) == runs


def test_the_run_name_leaves_out_cosmetic_overrides_and_ends_with_the_tag():
    run_name = load_script().run_name
    assert run_name("multi30k-en-de", ["lr=0.0035", "threads=1", "seed=3"], 2, None) == (
        "multi30k-en-de-lr0.0035-seed3-members2"
    )
    assert run_name("multi30k-de-en", ["seed=2"], 0, "isa-avx2") == "multi30k-de-en-seed2-isa-avx2"


def test_an_imdb_run_with_other_overrides_writes_other_results(tmp_path, monkeypatch):
    """``reproduce_imdb.py IMDB max_minutes=30`` wrote the default run's results/imdb-windows.json (and
    trained over its run directory): the overrides that change results name the files, and the
    results record the command."""
    module = load_script("reproduce_imdb")
    (tmp_path / "imdb").mkdir()
    (tmp_path / "imdb" / "train.tsv.gz").write_bytes(b"")
    written = {}
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "pretrain", lambda *a, **k: {"minutes": 1.0, "run_dir": "runs/pre"})
    monkeypatch.setattr(
        module,
        "train",
        lambda recipe, run, o: (
            written.setdefault("run", run) and {"minutes": 1.0, "run_dir": "runs/x", "updates": 9}
        ),
    )
    monkeypatch.setattr(module, "dev_scores", lambda *a: {"accuracy": 90.0})
    monkeypatch.setattr(
        module, "write_json", lambda path, data: written.setdefault("json", (path.name, data))
    )
    monkeypatch.setattr(module.encoder_runs, "check", lambda *a: None)
    monkeypatch.setattr(module, "curves", lambda *a: None)
    monkeypatch.setattr(
        sys,
        "argv",
        [str(SCRIPT.with_name("reproduce_imdb.py")), str(tmp_path / "imdb"), "max_minutes=30", "threads=1"],
    )
    module.main()
    name, data = written["json"]
    assert (
        name == "imdb-windows-max_minutes30.json"
        and written["run"].name == "imdb-windows-max_minutes30-finetune"
    )
    assert (
        data["command"].startswith("python scripts/reproduce_imdb.py ")
        and "max_minutes=30" in data["command"]
    )


@pytest.mark.parametrize(
    "lowercase", ["false", "true"]
)  # true: each member trains its own rule-table vocabulary
def test_members_train_side_by_side_and_their_ensembles_are_candidates(tmp_path, corpus, lowercase):
    reproduce = load_script()
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(f'task = "translation"\ndataset = "{corpus}"\nsrc_lang = "de"\ntgt_lang = "en"\n')
    overrides = [a for a in tiny_args(corpus, tmp_path / "unused") if not a.startswith("out_dir=")]
    overrides += ["max_steps=4", "eval_every=2", "keep_last=5", "seed=7", f"lowercase={lowercase}"]
    run_dir = tmp_path / "run"
    cfg = load_recipe(recipe, [*overrides, f"out_dir={run_dir}"])

    trained = reproduce.train_members(recipe, overrides, run_dir, cfg, 2)

    assert [(m["dir"], m["seed"], m["steps"], m["stopped_by"], m["max_tokens"]) for m in trained] == [
        ("member-1", 7, 4, "max_steps", 256),
        ("member-2", 8, 4, "max_steps", 256),
    ]
    configs = [json.loads((d / "train_config.json").read_text()) for d in reproduce.member_dirs(run_dir)]
    assert [(c["seed"], c["threads"]) for c in configs] == [(7, 1), (8, 1)]
    args = argparse.Namespace(average=5, ensemble=0, rerank_with=None)
    translators, averaged, ensembled = reproduce.candidates(run_dir, args)
    assert sorted(translators) == [
        "ensemble of averaged", "ensemble of best", "member-1/averaged", "member-1/best",
        "member-2/averaged", "member-2/best",
    ]  # fmt: skip
    assert [str(p.relative_to(run_dir)) for p in averaged] == [
        "member-1/step-000002",
        "member-1/step-000004",
        "member-2/step-000002",
        "member-2/step-000004",
    ]
    assert ensembled == []
    ensemble = translators["ensemble of best"].model
    assert isinstance(ensemble, Ensemble) and len(ensemble.members) == 2
    args.rerank_with = run_dir / "member-1" / "best"  # any model of the same vocabularies re-sorts
    reranked, _, _ = reproduce.candidates(run_dir, args)
    assert sorted(reranked) == sorted([*translators, *(f"{k} reranked" for k in translators)])
    ensemble_reranked = reranked["ensemble of best reranked"]
    assert isinstance(ensemble_reranked.translator.model, Ensemble)
    assert len(ensemble_reranked.translate(["ein hund", "zwei"], SearchConfig(beam=2))) == 2  # it decodes


def test_evaluate_only_finishes_a_run_whose_evaluation_failed(tmp_path, monkeypatch):
    reproduce = load_script()
    run_dir, results = tmp_path / "runs" / "reproduce-x", tmp_path / "results"
    (run_dir / "member-1" / "best").mkdir(parents=True)
    (run_dir / reproduce.TRAINING_FILE).write_text(json.dumps({"steps": [5, 6], "train_wall_minutes": 50.0}))
    monkeypatch.setattr(
        reproduce, "evaluate_translation", lambda *_: {"test": {"bleu": 1.0}, "evaluation_minutes": 2.0}
    )
    monkeypatch.setattr(reproduce, "plot_curves", lambda *_: [])
    cfg = load_recipe(ROOT / "recipes" / "multi30k-en-de.toml")
    assert reproduce.evaluate_again("x", run_dir, results, cfg, argparse.Namespace(), "abc") == 0
    out = json.loads((results / "x.json").read_text())
    assert (out["steps"], out["test"], out["end_to_end_minutes"]) == ([5, 6], {"bleu": 1.0}, 52.0)
    assert "previous_evaluation" not in out and out["evaluation_commit"] == "abc"
    assert reproduce.evaluate_again("x", run_dir, results, cfg, argparse.Namespace(), "def") == 0
    again = json.loads((results / "x.json").read_text())  # results/x.json holds this run's evaluation: kept
    assert again["previous_evaluation"]["test"] == {"bleu": 1.0} and again["steps"] == [5, 6]
    other = {**again, "steps": [900, 900], "train_wall_minutes": 40.0, "commit": "0ld"}  # a committed figure
    (results / "x.json").write_text(json.dumps(other))  # of another run, whose directory this run replaced
    assert reproduce.evaluate_again("x", run_dir, results, cfg, argparse.Namespace(), "ghi") == 0
    out = json.loads((results / "x.json").read_text())  # before: that run's steps and minutes, this BLEU
    assert (out["steps"], out["end_to_end_minutes"]) == ([5, 6], 52.0) and "previous_evaluation" not in out
    (run_dir / reproduce.TRAINING_FILE).unlink()  # a run from before training.json: results/x.json is read
    assert reproduce.evaluate_again("x", run_dir, results, cfg, argparse.Namespace(), "jkl") == 0
    assert json.loads((results / "x.json").read_text())["previous_evaluation"]["test"] == {"bleu": 1.0}


def test_member_dirs_sort_by_number(tmp_path):
    reproduce = load_script()
    for k in (10, 2, 1):
        (tmp_path / f"member-{k}").mkdir()
    assert [d.name for d in reproduce.member_dirs(tmp_path)] == ["member-1", "member-2", "member-10"]


@pytest.mark.parametrize("lowercase", [True, False])
def test_a_lowercase_run_chooses_on_lowercased_validation_references(lowercase):
    reproduce = load_script()
    cfg = load_recipe(ROOT / "recipes" / "multi30k-en-de.toml", [f"lowercase={str(lowercase).lower()}"])
    _, valid = reproduce.sources_and_references(cfg, "valid")
    _, test = reproduce.sources_and_references(cfg, "test")
    assert valid[0] == ("eine gruppe" if lowercase else "Eine Gruppe") + valid[0][11:]
    assert test[0].startswith("Ein Mann")  # scored both cased and lowercased


class FakeTranslator:
    """Translates every source to a prefix of the reference chosen by its quality and the search's
    length penalty, and records the searches it ran."""

    def __init__(self, quality: dict[float, int]):
        self.quality, self.searches = quality, []

    def translate(self, srcs, config):
        self.searches.append((config.beam, config.lenpen, config.mbr))
        n = self.quality[config.lenpen]
        return [" ".join(REFERENCE.split()[:n]) for _ in srcs]


REFERENCE = "a man in a blue shirt is standing on a ladder and cleaning a window"


@pytest.mark.parametrize("better_alpha", [1.0, 0.6])
def test_the_length_penalty_is_chosen_on_validation_for_the_chosen_pair_only(better_alpha):
    reproduce = load_script()
    winner = FakeTranslator({0.6: 10, 1.0: 13} if better_alpha == 1.0 else {0.6: 13, 1.0: 10})
    loser = FakeTranslator({0.6: 6, 1.0: 14})  # better with 1.0, but never asked: it lost at 0.6
    reranked = FakeTranslator({0.6: 7})
    translators = {"best": loser, "ensemble of best": winner, "best reranked": reranked}
    decodings = {"beam": SearchConfig(beam=5, lenpen=0.6), "mbr": SearchConfig(10, lenpen=0.6, mbr="bleu")}
    srcs, refs = ["x"] * 3, [REFERENCE] * 3

    choice, chosen, decoding, search = reproduce.choose_on_validation(
        translators, decodings, [0.6, 1.0], srcs, refs
    )

    assert (chosen, decoding, search.lenpen, search.beam) == ("ensemble of best", "beam", better_alpha, 5)
    tried = ["best reranked/beam", "best/beam", "best/mbr", "ensemble of best/beam",
             "ensemble of best/beam lenpen=1.0"]  # fmt: skip
    assert sorted(choice) == tried
    assert winner.searches == [(5, 0.6, None), (5, 1.0, None)]  # an ensemble: beam search only
    assert reranked.searches == [(5, 0.6, None)]  # a reranked beam: no minimum Bayes risk over it
    assert loser.searches == [(5, 0.6, None), (10, 0.6, "bleu")]
    assert choice["ensemble of best/beam lenpen=1.0"] != choice["ensemble of best/beam"]


def test_the_bidirectional_pipeline_stops_on_a_right_to_left_model_that_did_not_learn(tmp_path):
    """Stage 1 of ``reproduce_bidirectional.py`` must not hand a diverged right-to-left model to stage 2
    (its cache would be noise): the run is named with its best validation BLEU; a model that learnt
    passes."""
    module = load_script("reproduce_bidirectional")
    good, bad = tmp_path / "good", tmp_path / "bad"
    for d, bleus in ((good, [0.0, 3.5, 12.1]), (bad, [0.0, 0.01, 0.01])):
        d.mkdir()
        rows = [{"step": 250 * (i + 1), "split": "valid", "bleu": b} for i, b in enumerate(bleus)]
        rows.insert(1, {"step": 300, "split": "train", "loss": 5.0})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert module.check_r2l([good]) == [12.1]  # the best, for the results file
    with pytest.raises(
        SystemExit,
        match=r"bad: the right-to-left model did not learn \(best validation BLEU 0.01, at update 750\)",
    ):
        module.check_r2l([good, bad])


def test_the_bidirectional_pipeline_gives_r2l_overrides_to_stage_1_only(tmp_path, monkeypatch):
    """``--r2l lr=…`` reaches the right-to-left model's training, after the shared overrides (so it
    wins), and neither the cache nor the bidirectional model; the results record it."""
    module = load_script("reproduce_bidirectional")
    seen = {}

    def train_r2l(path, overrides, minutes, out, processes, jackknife):
        seen["stage1"] = overrides
        return [tmp_path / "r2l"], 60.0

    def build_cache(path, overrides):
        seen["cache"] = overrides
        return 6.0

    def train_final(recipe, overrides, minutes, name, processes, extra):
        seen["final"], seen["extra"], seen["processes"] = overrides, extra, processes
        return {"train_wall_minutes": minutes}

    monkeypatch.setattr(module, "ROOT", tmp_path)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "results").mkdir()
    shutil.copy(SCRIPT.parents[1] / "recipes" / "multi30k-de-en.toml", tmp_path / "recipes")
    for name, fake in (("train_r2l", train_r2l), ("build_cache", build_cache), ("train_final", train_final)):
        monkeypatch.setattr(module, name, fake)
    monkeypatch.setattr(module, "check_r2l", lambda dirs: [30.5])
    args = module.parser().parse_args(
        ["multi30k-de-en", "lr=0.004", "--minutes", "10", "--r2l", "lr=0.0025", "warmup=100"]
    )
    out = module.pipeline(args.recipe, args.overrides, ["model.bidirectional=true"], "bd", args)
    assert seen["stage1"] == ["lr=0.004", "lr=0.0025", "warmup=100"]
    assert module.load_recipe(tmp_path / "recipes" / "multi30k-de-en.toml", seen["stage1"]).lr == 0.0025
    assert "lr=0.0025" not in seen["cache"] and "lr=0.0025" not in seen["final"]
    assert seen["final"][:2] == ["lr=0.004", "model.bidirectional=true"]
    assert out["stages"]["r2l_overrides"] == ["lr=0.0025", "warmup=100"]
    assert out["stages"]["final_max_minutes"] == 8.9
    assert out["stages"]["r2l_valid_bleu"] == [30.5]
    assert seen["extra"] == []  # no reranking unless asked
    args = module.parser().parse_args(["multi30k-de-en", "--minutes", "10", "--rerank"])
    module.pipeline(args.recipe, args.overrides, ["model.bidirectional=true"], "bd", args)
    assert seen["extra"] == ["--rerank-with", str(tmp_path / "r2l" / "best")]  # stage 1's model
    args = module.parser().parse_args(
        ["multi30k-de-en", "--minutes", "10", "--processes", "2", "--members", "2"]
    )
    out = module.pipeline(args.recipe, args.overrides, ["model.bidirectional=true"], "bd", args)
    assert seen["extra"] == ["--members", "2"] and seen["processes"] == 1  # reproduce.py starts the members
    assert out["stages"]["members"] == 2
    assert module.run_name(args) == "multi30k-de-en-bidirectional-members2"
    args = module.parser().parse_args(["multi30k-de-en", "--jackknife", "--name", "x", "--tag", "zen5"])
    assert module.run_name(args) == "x-zen5"


def test_the_vocabulary_overrides_train_stage_1s_tokenizer_and_the_later_stages_read_it(
    tmp_path, monkeypatch
):
    """``vocab_size`` given to the pipeline trains the right-to-left model's tokenizer; the cache and the
    bidirectional model read that tokenizer through ``r2l_model``, where the field would do nothing (and
    is refused), so they are given the other overrides only."""
    module = load_script("reproduce_bidirectional")
    seen, r2l = {}, tmp_path / "r2l"
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(
        module, "train_r2l", lambda path, o, *a: (seen.setdefault("stage1", o), ([r2l], 60.0))[1]
    )
    monkeypatch.setattr(module, "build_cache", lambda path, o: (seen.setdefault("cache", o), 6.0)[1])
    final = lambda recipe, o, *a: (seen.setdefault("final", o), {"train_wall_minutes": 1})[1]  # noqa: E731
    monkeypatch.setattr(module, "train_final", final)
    monkeypatch.setattr(module, "check_r2l", lambda dirs: [30.5])
    (tmp_path / "results").mkdir()
    overrides = ["vocab_size=6000", "joint_vocab=true", "weight_decay=0.1"]
    args = module.parser().parse_args(["multi30k-de-en", *overrides, "--minutes", "10"])
    module.pipeline(
        args.recipe, args.overrides, ["model.bidirectional=true", "r2l_memory_from=cache"], "bd", args
    )
    assert seen["stage1"] == overrides
    assert seen["cache"] == seen["final"] and seen["final"][0] == "weight_decay=0.1"
    assert not [o for o in seen["final"] if o.startswith(("vocab_size", "joint_vocab"))]
    recipe = ROOT / "recipes" / "multi30k-de-en.toml"
    assert load_recipe(recipe, seen["final"]).options.r2l_model == str(r2l)  # accepted: nothing inert left
    with pytest.raises(
        ConfigError, match="vocab_size=6000 does nothing: r2l_model=.* brings its own tokenizer"
    ):
        load_recipe(recipe, ["vocab_size=6000", *seen["final"]])
