"""Recipes after the split of the fields: the shared ones in ``TrainConfig``, each task's own in its
``TaskOptions``; recipes stay flat, and a run's ``train_config.json`` from before the split resumes."""

import dataclasses
import json
from pathlib import Path

import pytest

from aiayn.errors import ConfigError, ModelDirError
from aiayn.training.config import TrainConfig, to_dict
from aiayn.training.recipe import config_from_dict, load_recipe
from aiayn.training.rundir import check_resume_compatible
from aiayn.training.tasks.lm import LMOptions
from aiayn.training.tasks.translation_options import TranslationOptions

ROOT = Path(__file__).resolve().parents[2]
BEFORE = Path(__file__).with_name("data") / "train_config_before_task_options.json"  # 64 fields, flat
RECIPE = ROOT / "recipes" / "multi30k-de-en.toml"
OVERRIDES = ["r_drop=5.0", "out_dir=runs/old"]  # what that run was started with


def test_a_train_config_from_before_the_split_reads_and_resumes(tmp_path):
    saved = json.loads(BEFORE.read_text(encoding="utf-8"))
    assert {"mask_prob", "block_size", "class_weights"} <= saved.keys()  # other tasks' fields, at defaults
    check_resume_compatible(saved, load_recipe(RECIPE, OVERRIDES), tmp_path)
    again = config_from_dict({k: v for k, v in saved.items() if k != "run_id"})
    assert isinstance(again.options, TranslationOptions) and again.options.r_drop == 5.0
    with pytest.raises(ConfigError, match=r"cannot resume .*: r_drop was 5.0, now 1.0 \(1 incompatible"):
        check_resume_compatible(saved, load_recipe(RECIPE, ["r_drop=1.0", "out_dir=runs/old"]), tmp_path)


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes").glob("*.toml")), ids=lambda p: p.stem)
def test_every_recipe_round_trips_through_its_flat_form(recipe):
    cfg = load_recipe(recipe)
    assert config_from_dict(to_dict(cfg)) == cfg
    shared = {f.name for f in dataclasses.fields(TrainConfig)} - {"options"}
    own = {f.name for f in dataclasses.fields(cfg.options)}
    assert not shared & own and set(to_dict(cfg)) == shared | own


def test_each_task_owns_its_fields():
    lm = load_recipe(None, ["task=lm", "tokenizer=char", "block_size=32", "eval_bleu=false"])
    assert isinstance(lm.options, LMOptions) and lm.options.block_size == 32
    assert not hasattr(lm, "r_drop") and not hasattr(lm.options, "eval_bleu")  # dropped: translation's
    with pytest.raises(ConfigError, match="block_size=0 must be ≥ 1"):
        load_recipe(None, ["task=lm", "tokenizer=char", "block_size=0"])
    with pytest.raises(ConfigError, match=r"override 'block_sise=3': unknown key 'block_sise'"):
        load_recipe(None, ["task=lm", "tokenizer=char", "block_sise=3"])
    with pytest.raises(
        ConfigError, match="r_drop=1 is R-Drop for translation models and classifiers; task='mlm' does not"
    ):
        load_recipe(None, ["task=mlm", "r_drop=1"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["min_lr=1e-5"], r"'min_lr=1e-5': min_lr=1e-5 does nothing: schedule='noam' does not read it"),
        (["schedule=constant", "decay_steps=500"], "decay_steps=500 does nothing: schedule='constant'"),
        (["short_budget=halve_max_tokens"], "does nothing: it acts on a time budget, and max_minutes=0"),
        (["r2l_weight=0.5"], "r2l_weight=0.5 does nothing: it is for model.bidirectional=true"),
        (["r2l_detach=true"], "r2l_detach=true does nothing: it is for model.bidirectional=true"),
        (["r2l_memory_from=reference"], "r2l_memory_from=reference does nothing: it is for model.bidir"),
        (
            [
                "model.bidirectional=true",
                "r2l_memory_from=cache",
                "r2l_model=m",
                "r2l_init=true",
                "r2l_freeze=true",
                "r2l_weight=0.5",
            ],
            "r2l_weight=0.5 does nothing: r2l_freeze=true keeps r2l_model's decoder",
        ),
        (["r2l_cache_beam=4"], "r2l_cache_beam=4 does nothing: .* r2l_model, which is not given"),
        (["eval_bleu=false", "eval_max_sentences=100"], "eval_max_sentences=100 does nothing: eval_bleu=f"),
        (["task=lm", "max_len=100"], "max_len=100 does nothing: task='lm' trains on windows of block_size"),
        (["task=lm", "max_tokens=100"], "max_tokens=100 does nothing: task='lm' batches batch_size windows"),
        (["task=lm", "tokenizer=char", "vocab_size=100"], "vocab_size=100 does nothing: tokenizer='char'"),
        (
            ["task=classify", "init_from=x", "vocab_size=100"],
            "vocab_size=100 does nothing: init_from='x' brings",
        ),
        (
            ["task=classify", "init_from=x", "tokenizer=unigram"],
            "tokenizer=unigram does nothing: init_from='x'",
        ),
        (
            ["r2l_model=m", "r2l_distill=true", "joint_vocab=false"],
            "joint_vocab=false does nothing: r2l_model='m'",
        ),
        (
            ["r2l_model=m", "r2l_distill=true", "vocab_size=100"],
            "vocab_size=100 does nothing: r2l_model='m' brings",
        ),
    ],
)
def test_an_override_that_would_do_nothing_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(None, overrides)


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_dataset_is_refused_by_name(value):
    """dataset= read the current folder ("" is "." to the file readers) and failed on a file name."""
    with pytest.raises(ConfigError, match="dataset=.* is empty: name a bundled dataset"):
        load_recipe(None, [f"dataset={value}"])


def test_an_inline_table_override_does_not_drop_the_recipes_table_silently():
    """``model={dropout=0.3}`` replaced the recipe's whole [model] table: its sizes went back to the
    paper's base model (ten times the recipe's) without a word. Refused, naming the dotted form."""
    with pytest.raises(ConfigError, match=r"whole \[model\] table .* model\.dropout=…"):
        load_recipe(RECIPE, ["model={dropout=0.3}"])
    assert load_recipe(RECIPE, ["model.dropout=0.3"]).model["d_model"] == load_recipe(RECIPE).model["d_model"]
    assert load_recipe(None, ["model={d_model=64, n_heads=2}"]).model["d_model"] == 64  # no table to drop


def test_a_recipes_field_that_an_override_turns_off_is_left_alone():
    """The recipe's min_lr and short_budget are inert under these overrides: the user changed the
    schedule and the budget, not them; and a field set to its default does nothing either way."""
    cfg = load_recipe(RECIPE, ["schedule=inverse_sqrt", "horizon=steps", "max_minutes=0", "min_lr=0"])
    assert cfg.min_lr == 0 and cfg.short_budget == "halve_max_tokens"
    assert load_recipe(RECIPE, ["schedule=inverse_sqrt", "horizon=steps"]).min_lr == 1e-4
    with pytest.raises(ConfigError, match="min_lr=0.001 does nothing"):
        load_recipe(RECIPE, ["schedule=inverse_sqrt", "horizon=steps", "min_lr=0.001"])
    load_recipe(None, ["model.bidirectional=true", "r2l_weight=0.5", "r2l_detach=true"])
    load_recipe(None, ["task=lm", "tokenizer=char", "block_size=32", "max_len=256", "eval_bleu=false"])


def test_a_task_needs_its_own_options():
    from aiayn.training.distributed import DistInfo
    from aiayn.training.tasks.translation import TranslationTask

    with pytest.raises(ConfigError, match="needs its options .*aiayn.training.recipe"):
        TranslationTask(TrainConfig(), Path("unused"), DistInfo())


def test_a_string_field_on_the_command_line_is_its_text_whatever_toml_reads_in_it(tmp_path):
    cfg = load_recipe(None, ["out_dir=2024-06-01", "tgt_lang=inf", "src_lang=true"])
    assert (cfg.out_dir, cfg.options.tgt_lang, cfg.options.src_lang) == ("2024-06-01", "inf", "true")
    with pytest.raises(ConfigError, match="override 'seed=inf': seed must be int"):  # not a string field
        load_recipe(None, ["seed=inf"])
    recipe = tmp_path / "dated.toml"
    recipe.write_text("out_dir = 2024-06-01\n", encoding="utf-8")  # in a file, TOML's types stand
    with pytest.raises(ConfigError, match="dated.toml: out_dir must be str"):
        load_recipe(recipe)


def test_a_recipe_saved_with_a_byte_order_mark_reads(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_bytes(b"\xef\xbb\xbf" + RECIPE.read_bytes())  # as some Windows editors save UTF-8
    assert load_recipe(recipe, []).max_len == load_recipe(RECIPE, []).max_len


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model=5"], "override 'model=5': model must be a table \\(e.g. model.d_model=256\\), got 5"),
        (["task=mlm", "extra_text=12"], "override 'extra_text=12': extra_text must be a list .*, got 12"),
    ],
)
def test_a_table_or_list_field_given_a_scalar_is_one_line_not_its_text(overrides, message):
    # list[str] and dict[str, Any] hold strings but are not string fields: "12" is no list of files
    with pytest.raises(ConfigError, match=message):
        load_recipe(None, overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [  # a kept pair of max_len pieces needs max_len + 1 positions (its bos or eos), not max_len
        (["max_len=8", "model.positional=learned", "model.max_len=8"],
         r"model.max_len=8: learned positions cannot hold the 9 positions that max_len=8 allows; raise "
         r"model.max_len to 9 or lower max_len"),
        (["max_len=100", "max_tokens=40", "model.positional=learned", "model.max_len=39"],
         r"model.max_len=39: .* the 40 positions that max_len=39 allows"),  # max_tokens cuts first
        (["task=lm", "tokenizer=char", "block_size=128", "model.positional=learned", "model.max_len=64"],
         r"model.max_len=64: learned positions cannot hold the 128 positions that block_size=128 allows; "
         r"raise model.max_len to 128 or lower block_size"),
    ],
)  # fmt: skip
def test_learned_positions_too_few_for_the_data_are_refused_before_training(overrides, message):
    """Before: accepted, and the run stopped at its first long batch (or evaluation) with a DataError."""
    with pytest.raises(ConfigError, match=message):
        load_recipe(None, overrides)


@pytest.mark.parametrize(
    "overrides",
    [["max_len=8", "model.positional=learned", "model.max_len=9"],
     ["task=lm", "tokenizer=char", "block_size=64", "model.positional=learned", "model.max_len=64"],
     ["max_len=8", "model.max_len=8"]],  # sinusoidal positions grow: no limit
)  # fmt: skip
def test_learned_positions_that_fit_are_accepted(overrides):
    load_recipe(None, overrides)


def test_a_run_started_with_a_field_that_does_nothing_resumes(tmp_path):
    """A run started before such overrides were refused may carry one in its train_config.json: it
    resumes without it (it computed nothing), where it was refused as a changed field."""
    cfg = load_recipe(None, ["out_dir=runs/old"])
    saved = {**to_dict(cfg), "min_lr": 1e-5, "eval_max_sentences": 100, "r2l_weight": 0.5}
    check_resume_compatible({**saved, "eval_bleu": False}, load_recipe(None, ["eval_bleu=false"]), tmp_path)
    with pytest.raises(ConfigError, match="eval_max_sentences was 100, now 0"):  # it sets what best compares
        check_resume_compatible(saved, cfg, tmp_path)
    with pytest.raises(ConfigError, match="schedule was 'cosine', now 'noam' .*: schedule\\)"):  # the switch
        check_resume_compatible({**saved, "schedule": "cosine", "eval_max_sentences": 0}, cfg, tmp_path)


def test_resuming_under_another_task_names_the_task_first(tmp_path):
    """Before, a run of task=lm resumed without task=lm was refused as "model.activation was 'unset'"
    among 32 fields, task the last of them."""
    saved = to_dict(load_recipe(None, ["task=lm", "tokenizer=char", "model.activation=gelu"]))
    with pytest.raises(ConfigError, match=r"cannot resume .*: task was 'lm', now 'translation' \("):
        check_resume_compatible(saved, load_recipe(None), tmp_path)


@pytest.mark.parametrize(
    ("recipe", "overrides", "message"),
    [  # the model config's class name alone said neither the recipe nor the override
        ("[model]\nd_model = 7\n", [], r"^recipe \S+r\.toml: \[model\] LMConfig\.d_model=7 must be"),
        ("[model]\nd_model = 7\n", ["model.n_heads=3", "lr=0.1"],
         r"^recipe \S+r\.toml with override 'model\.n_heads=3': \[model\] LMConfig\.d_model=7 must be"),
        (None, ["model.foo=3", "model.d_model=64"],
         r"^overrides 'model\.foo=3', 'model\.d_model=64': \[model\] LMConfig: unknown field\(s\) \['foo'\]"),
        (None, ["model.foo=3"], r"^override 'model\.foo=3': \[model\] LMConfig: unknown field"),
    ],
)  # fmt: skip
def test_a_bad_model_table_names_where_it_came_from(tmp_path, recipe, overrides, message):
    path = None
    if recipe is not None:
        path = tmp_path / "r.toml"
        path.write_text('task = "lm"\n' + recipe)
    with pytest.raises(ConfigError, match=message):
        load_recipe(path, overrides if path else ["task=lm", *overrides])


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        # before: accepted, and a German and an English piece of the same id shared one embedding
        (
            ["joint_vocab=false", "model.share_embeddings=true"],
            r"model.share_embeddings=true with joint_vocab=false",
        ),
        # before: accepted, then replaced by the tokenizer's without a word
        (["model.tgt_vocab_size=4000"], r"model.tgt_vocab_size is set from the run's tokenizer"),
        (
            ["task=lm", "dataset=shakespeare", "tokenizer=char", "model.vocab_size=500"],
            r"model.vocab_size is set from",
        ),
        (["task=mlm", "dataset=sst2", "model.pad_id=3"], r"model.pad_id is set from the run's tokenizer"),
        # before: an error about window_stride, whose fix was "use at most -1"
        (["task=classify", "dataset=x.tsv", "max_len=1"], r"max_len=1 leaves no room"),
    ],
)
def test_model_fields_the_run_sets_and_impossible_lengths_are_refused_by_name(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_recipe(RECIPE if overrides[0].startswith(("joint", "model.")) else None, overrides)


def test_a_saved_config_whose_model_is_not_a_table_is_refused_in_one_line(tmp_path):
    """A hand-edited train_config.json with ``"model": null`` was a TypeError traceback on --resume."""
    saved = json.loads(BEFORE.read_text(encoding="utf-8"))
    with pytest.raises(
        ModelDirError, match=r"train_config.json: 'model' is NoneType, not the run's \[model\]"
    ):
        check_resume_compatible({**saved, "model": None}, load_recipe(RECIPE, OVERRIDES), tmp_path)
