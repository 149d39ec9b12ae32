"""A time-budgeted run (horizon="budget"): the cosine schedule follows the training time spent, so
the run ends annealed when the budget ends, and --resume is exact given the same times. The clock
is a fake that advances 0.25 s per reading, so "time" is the same in every run."""

import json
import types

import pytest

from aiayn.cli.main import main
from aiayn.training import trainer as trainer_module
from aiayn.training.budget import slow_machine_hint
from aiayn.training.recipe import config_from_dict, load_recipe
from aiayn.training.schedule import Schedule
from tests.training.conftest import tiny_args

BUDGET = ["schedule=cosine", "lr=0.003", "warmup=2", "min_lr=0.0001", "horizon=budget", "max_minutes=0.05",
          "decay_steps=1000", "eval_every=4", "model.dropout=0.2"]  # fmt: skip
TICK, SECONDS = 0.25, 3.0  # each reading of the clock; the budget (0.05 minutes)


@pytest.fixture(autouse=True)
def _fake_clock(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))
    clock = types.SimpleNamespace(t=0.0)

    def perf_counter() -> float:
        clock.t += TICK
        return clock.t

    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(perf_counter=perf_counter))


def _train(run) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == "train"]


def test_the_schedule_spans_the_budget_and_ends_annealed(corpus, tmp_path):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=1000", *BUDGET)]) == 0
    records = _train(run)
    steps = [r["step"] for r in records]
    assert steps == list(range(1, 14))  # 13 updates of 0.25 s exceed 3 s: the budget ends the run
    cos = Schedule("cosine", 0.003, 2, min_lr=0.0001, decay_steps=1000)
    for r in records:  # update s runs after (s - 1) · 0.25 s of training
        assert r["lr"] == pytest.approx(cos(r["step"], (r["step"] - 1) * TICK / SECONDS), rel=1e-12)
    assert records[-1]["lr"] < 0.0002 < cos(13)  # by steps alone it would barely have decayed


def test_resume_is_exact_given_the_same_times(corpus, tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert main(["train", *tiny_args(corpus, ref, "max_steps=1000", *BUDGET)]) == 0
    assert main(["train", *tiny_args(corpus, run, "max_steps=6", *BUDGET)]) == 0  # stopped early
    assert main(["train", *tiny_args(corpus, run, "max_steps=1000", *BUDGET), "--resume"]) == 0
    assert [(r["step"], r["loss"], r["lr"]) for r in _train(run)] == [
        (r["step"], r["loss"], r["lr"]) for r in _train(ref)
    ]


def test_the_progress_bar_counts_to_the_updates_the_budget_held(corpus, tmp_path, capsys):
    """Its total follows the budget (refreshed every log_every updates) and never falls behind the
    count: tqdm would switch to a bare "13it" counter. At the end it reads 13/13."""
    args = tiny_args(corpus, tmp_path / "run", "max_steps=1000", *BUDGET, "log_every=5", "progress=true")
    assert main(["train", *args]) == 0
    err = capsys.readouterr().err
    assert "13/13 [" in err and "it [" not in err and "/1000 [" in err


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["horizon=budget", "schedule=noam", "max_minutes=5"], "horizon='budget' needs schedule='cosine'"),
        (["horizon=budget", "schedule=cosine"], "max_minutes > 0"),
        (["horizon=time"], "horizon='time' is not one of"),
    ],
)
def test_a_budget_horizon_needs_a_cosine_and_a_budget(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_recipe(None, overrides)


@pytest.mark.parametrize(
    ("fields", "reachable", "advice"),
    [
        ({}, 1029, "max_tokens=2048"),  # de→en on the Zen 1 VM: 1,029 of the recipe's 3,600
        ({}, 2194, None),  # the AVX2-limited Xeon: 2,194 updates held 41.5 BLEU
        ({"max_tokens": 8192}, 1029, "max_tokens=4096"),
        ({"max_tokens": 1024}, 100, None),  # already small
        ({"task": "lm"}, 100, None),  # measured on translation only
        ({"max_len": 2048}, 100, None),  # half the batch would not hold the longest pairs
    ],
)
def test_a_slow_machine_is_told_that_smaller_updates_train_further(fields, reachable, advice):
    cfg = config_from_dict({"task": "translation", "max_steps": 3600, "max_tokens": 4096, **fields})
    hint = slow_machine_hint(cfg, reachable)
    if advice is None:
        assert hint is None
    else:
        assert advice in hint and "under a third of max_steps" in hint


SHORT = ["max_tokens=2048", "max_minutes=0.25", "max_steps=1000", "short_budget=halve_max_tokens",
         "eval_every=10"]  # fmt: skip  # 61 updates of 0.25 s pass 15 s: under a third of max_steps


def _stop_after(monkeypatch, step: int):
    """Stop the run as a SIGINT would (save, and exit 130) once update ``step`` is done."""
    real = trainer_module.Trainer.train_step

    def train_step(self, batches):
        stats = real(self, batches)
        if self.step == step:
            self._stop_signal = "SIGINT"
        return stats

    monkeypatch.setattr(trainer_module.Trainer, "train_step", train_step)


def test_a_short_budget_halves_the_batches_once(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, *SHORT)]) == 0
    err = capsys.readouterr().err
    assert err.count("on with max_tokens=1024") == 1 and "updates/s of max_tokens=1024" in err
    records = _train(run)
    assert [r["step"] for r in records] == list(range(1, 62))
    before, after = records[:20], records[20:]
    assert {r["max_tokens"] for r in before} == {2048} and {r["max_tokens"] for r in after} == {1024}
    # targets per update follow the padded size: every batch of the tiny corpus's pairs is then half as big
    assert max(r["tokens"] for r in after) <= 1024 < max(r["tokens"] for r in before)
    state = json.loads((run / "step-000061" / "trainer_state.json").read_text())
    assert state["max_tokens"] == 1024 and state["speed_checked"] is True


def test_a_long_enough_budget_keeps_the_batches(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, *SHORT, "max_steps=150")]) == 0  # 60 ≥ 150 / 3
    assert "on with max_tokens" not in capsys.readouterr().err
    assert {r["max_tokens"] for r in _train(run)} == {2048}


@pytest.mark.parametrize("stop", [8, 30])  # before the speed is measured (update 20), and after it halved
def test_resume_around_the_halving_is_exact(corpus, tmp_path, monkeypatch, stop):
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert main(["train", *tiny_args(corpus, ref, *SHORT)]) == 0
    with monkeypatch.context() as m:
        _stop_after(m, stop)
        assert main(["train", *tiny_args(corpus, run, *SHORT)]) == 130  # interrupted: 128 + SIGINT
    assert _train(run)[-1]["step"] == stop
    assert main(["train", *tiny_args(corpus, run, *SHORT), "--resume"]) == 0

    def rows(path):
        return [(r["step"], r["loss"], r["lr"], r["max_tokens"], r["tokens"]) for r in _train(path)]

    assert rows(run) == rows(ref)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["short_budget=halve"], "short_budget='halve' is not one of"),
        (["short_budget=halve_max_tokens", "task=lm"], "task='lm' has none to resize"),
    ],
)
def test_short_budget_is_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_recipe(None, overrides)


def test_a_run_from_before_short_budget_resumes_under_a_recipe_that_sets_it(corpus, tmp_path, capsys):
    """Its checkpoints hold no decision: it keeps its batches (as it would have without the field)."""
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, *SHORT, "max_steps=12")]) == 0

    def forget(path, *keys):  # as such a run wrote its files
        data = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in data.items() if k not in keys}))

    forget(run / "train_config.json", "short_budget")
    for path in run.glob("step-*/trainer_state.json"):
        forget(path, "max_tokens", "speed_checked")
    capsys.readouterr()
    assert main(["train", *tiny_args(corpus, run, *SHORT), "--resume"]) == 0
    assert "on with max_tokens" not in capsys.readouterr().err
    records = _train(run)
    assert records[-1]["step"] == 61 and {r["max_tokens"] for r in records} == {2048}
