"""The trainer end to end: checkpoints, exact resume after SIGKILL, signals, divergence, bad
configuration, averaging and plots. Runs use a tiny model on a tiny synthetic corpus."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aiayn.cli.main import main
from aiayn.decoding.generator import Generator
from aiayn.decoding.options import SearchConfig
from aiayn.errors import ModelDirError
from aiayn.models.io import load_model
from aiayn.training import checkpoint as ckpt
from aiayn.training import precision, trainer
from aiayn.training.recipe import load_recipe
from aiayn.training.trainer import Trainer, TrainingDiverged
from tests.training.conftest import make_corpus, tiny_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))


def _train_losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["split"] == "train"}


def _spawn(args, *driver_options: str) -> subprocess.Popen:
    """``aiayn train ARGS`` in a child process, through the test driver (its options patch in
    test-only instrumentation)."""
    driver = [str(ROOT / "tests" / "training" / "driver.py"), *driver_options, "--"]
    return subprocess.Popen([sys.executable, *driver, *args], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_a_warm_up_longer_than_the_run_is_said(corpus, tmp_path, capsys):
    """The paper's warmup=4000 in a 60-update run never reaches its peak learning rate: said, once."""
    assert main(["train", *tiny_args(corpus, tmp_path / "a", "max_steps=2", "warmup=3")]) == 0
    assert capsys.readouterr().err.count("warmup=3 is more than max_steps=2: the learning rate rises") == 1
    assert main(["train", *tiny_args(corpus, tmp_path / "b", "max_steps=3", "warmup=3")]) == 0
    assert "warmup=" not in capsys.readouterr().err


def test_train_writes_checkpoints_metrics_and_a_loadable_model(corpus, tmp_path):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=12", "eval_every=4", "keep_last=2")]) == 0
    steps = {p.name for p in run.glob("step-*")}
    best = Path(os.readlink(run / "best")).name
    assert steps == {"step-000008", "step-000012", best}  # the last two, and the best if it is older
    assert (run / "best").is_symlink() and (run / "train_config.json").is_file()
    losses = _train_losses(run)
    assert sorted(losses) == list(range(1, 13)) and losses[12] < losses[1]
    valid = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"valid"' in x]
    assert [v["step"] for v in valid] == [4, 8, 12] and all(v["ppl"] > 1 for v in valid)
    model = load_model(run)  # the run directory resolves to its best checkpoint
    assert model.config.d_model == 32 and (run / "best" / "src").is_dir()
    assert not list(run.glob(".tmp-*"))


def test_bf16_training_learns_and_saves_float32_weights(corpus, tmp_path):
    """``precision=bf16`` (autocast, float32 master weights): the loss falls, and the checkpoint
    holds float32 weights."""
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=12", "eval_every=12", "precision=bf16")]) == 0
    losses = _train_losses(run)
    assert sorted(losses) == list(range(1, 13)) and losses[12] < losses[1]
    assert {p.dtype for p in load_model(run).parameters()} == {torch.float32}


@pytest.mark.parametrize(("speedup", "chosen"), [(2.4, "bf16"), (1.1, "fp32")])
def test_precision_auto_trains_in_bf16_only_where_bf16_products_are_faster(
    corpus, tmp_path, capsys, monkeypatch, speedup, chosen
):
    measured = []
    monkeypatch.setattr(precision, "bf16_speedup", lambda *a: measured.append(a) or speedup)
    used = []
    real_autocast = trainer.autocast
    monkeypatch.setattr(trainer, "autocast", lambda d, p: used.append(p) or real_autocast(d, p))
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=2", "eval_every=2", "precision=auto")]) == 0
    assert f"precision=auto chose {chosen}" in capsys.readouterr().err
    assert len(measured) == 1 and measured[0][1:] == (256, 32, 64)  # max_tokens, d_model, d_ff
    assert used and set(used) == {chosen}  # every training and evaluation step


def test_precision_auto_choosing_fp32_trains_as_precision_fp32_does(corpus, tmp_path, monkeypatch):
    """The measurement drew its matrices from the dropout masks' random stream, so a run where auto
    chose fp32 differed from one given fp32."""
    real = precision.bf16_speedup
    monkeypatch.setattr(precision, "bf16_speedup", lambda *a: real(*a) * 0 + 1.0)  # draws, then says fp32
    runs = {}
    for p in ("fp32", "auto"):
        run = tmp_path / p
        assert (
            main(["train", *tiny_args(corpus, run, "max_steps=3", "model.dropout=0.3", f"precision={p}")])
            == 0
        )
        lines = (run / "metrics.jsonl").read_text().splitlines()
        runs[p] = [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]
    assert runs["auto"] == runs["fp32"]


def test_a_resumed_run_keeps_the_precision_auto_chose_when_it_started(corpus, tmp_path, capsys, monkeypatch):
    """Before, "auto" measured again on resume, and a run resumed on another (or a busier) machine
    changed its arithmetic halfway."""
    speedups = iter([2.4, 1.1])
    monkeypatch.setattr(precision, "bf16_speedup", lambda *a: next(speedups))
    used = []
    real_autocast = trainer.autocast
    monkeypatch.setattr(trainer, "autocast", lambda d, p: used.append(p) or real_autocast(d, p))
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=2", "eval_every=2", "precision=auto")]) == 0
    assert "precision=auto chose bf16" in capsys.readouterr().err
    used.clear()
    assert (
        main(["train", *tiny_args(corpus, run, "max_steps=4", "eval_every=2", "precision=auto"), "--resume"])
        == 0
    )
    assert "precision=auto keeps bf16, as the run chose when it started" in capsys.readouterr().err
    assert used and set(used) == {"bf16"}
    assert next(speedups) == 1.1  # not measured again


def test_bf16_speedup_times_a_float32_and_a_bfloat16_product_of_the_given_size(monkeypatch):
    calls, linear = [], torch.nn.functional.linear

    def recorded(x, w):
        calls.append((x.dtype, *x.shape, w.size(0)))
        return linear(x, w)

    monkeypatch.setattr(torch.nn.functional, "linear", recorded)
    assert precision.bf16_speedup(torch.device("cpu"), 64, 16, 32) > 0
    assert calls == [(torch.float32, 64, 16, 32)] * 6 + [(torch.bfloat16, 64, 16, 32)] * 6


@pytest.mark.slow
def test_resume_after_sigkill_during_checkpoint_write_is_exact(corpus, tmp_path):
    """A 15-step run equals one killed (while writing its step-10 checkpoint) and resumed."""
    args = ["max_steps=15", "eval_every=5", "model.dropout=0.3"]
    ref = tmp_path / "ref"
    assert main(["train", *tiny_args(corpus, ref, *args)]) == 0

    run = tmp_path / "run"
    proc = _spawn(tiny_args(corpus, run, *args), "--pause-checkpoint", "10:60")
    deadline = time.time() + 120
    while not list(run.glob(".tmp-step-000010-*/trainer_state.json")):  # written, not yet renamed
        assert proc.poll() is None, proc.communicate()[1]
        assert time.time() < deadline, "the run never reached its step-10 checkpoint"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert sorted(p.name for p in run.glob("step-*")) == ["step-000005"]  # the torn write left no step-10

    assert main(["train", *tiny_args(corpus, run, *args), "--resume"]) == 0
    assert not list(run.glob(".tmp-*"))
    assert _train_losses(run) == _train_losses(ref)  # identical, bit for bit


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_as_a_terminated_program(corpus, tmp_path):
    run = tmp_path / "run"
    proc = _spawn(tiny_args(corpus, run, "max_steps=100000", "eval_every=100000"))
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() or len((run / "metrics.jsonl").read_text().splitlines()) < 3:
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err  # 143: stopped, not finished
    assert "(SIGTERM)" in err
    saved = list(run.glob("step-*"))
    assert len(saved) == 1 and (saved[0] / "model.safetensors").is_file()
    step = int(saved[0].name.split("-")[1])
    assert step == max(_train_losses(run))


def _sigterm_at_update_8(monkeypatch, args: list[str]) -> None:
    """``aiayn train ARGS`` stopped as a SIGTERM during update 8 stops it (exit 143)."""
    real = Trainer.train_step

    def train_step(self, batches):
        stats = real(self, batches)
        if self.step == 8:
            self._stop_signal = "SIGTERM"
        return stats

    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", train_step)
        assert main(["train", *args]) == 143


def test_a_signal_saves_without_evaluating_so_the_resumed_run_evaluates_as_an_uninterrupted_one(
    corpus, tmp_path, monkeypatch
):
    args = ["max_steps=15", "eval_every=5", "model.dropout=0.3"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert main(["train", *tiny_args(corpus, ref, *args)]) == 0
    _sigterm_at_update_8(monkeypatch, tiny_args(corpus, run, *args))
    assert (run / "step-000008" / "model.safetensors").is_file()
    assert os.readlink(run / "best").endswith("step-000005")  # the only evaluated checkpoint

    def records(path):
        rows = map(json.loads, (path / "metrics.jsonl").read_text().splitlines())
        return [(r["split"], r["step"], r["loss"]) for r in rows]

    assert ("valid", 8) not in [r[:2] for r in records(run)]
    assert main(["train", *tiny_args(corpus, run, *args), "--resume"]) == 0
    assert records(run) == records(ref)  # the same updates, evaluated at the same steps


def test_a_signal_during_the_last_update_stops_the_run_as_a_signal_without_evaluating(
    corpus, tmp_path, monkeypatch
):
    """SIGTERM received during update 8 of 8: the run ends as stopped (143), saved but not evaluated
    (a grace period is short), not as finished; resumed, it evaluates that checkpoint."""
    run = tmp_path / "run"
    _sigterm_at_update_8(monkeypatch, tiny_args(corpus, run, "max_steps=8", "eval_every=5"))
    assert (run / "step-000008" / "model.safetensors").is_file()
    assert os.readlink(run / "best").endswith("step-000005")
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", "eval_every=5"), "--resume"]) == 0
    valid = [
        json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"valid"' in x
    ]
    assert valid == [5, 8]


def test_a_resumed_run_purges_the_tensorboard_events_after_its_checkpoint(corpus, tmp_path):
    """TensorBoard's writer is told to drop the events past the checkpoint (as metrics.jsonl drops its
    lines), so that a resumed run's curve has one value per step; a new run purges nothing."""
    opened = []

    class Writer:
        def __init__(self, log_dir, purge_step=None):
            opened.append(purge_step)

        def add_scalar(self, *args, **kwargs):
            pass

        def close(self):
            pass

    run = tmp_path / "run"
    for extra in ([], ["--resume"]):
        trainer = Trainer(load_recipe(None, tiny_args(corpus, run, f"max_steps={6 + 4 * len(extra)}",
                                                      "eval_every=3")), resume=bool(extra))  # fmt: skip
        trainer.tensorboard = Writer
        trainer.fit()
    assert opened == [None, 7]


def test_tokens_per_s_counts_updates_not_the_evaluation_before_them(corpus, tmp_path, monkeypatch):
    """The log line after an evaluation measures the updates since it, not the evaluation's time."""
    run = tmp_path / "run"
    trainer = Trainer(load_recipe(None, tiny_args(corpus, run, "max_steps=8", "eval_every=4", "log_every=2")))
    real = trainer.evaluate

    def slow_evaluate():
        time.sleep(1.0)
        return real()

    trainer.evaluate = slow_evaluate
    trainer.fit()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    speed = {r["step"]: r["tokens_per_s"] for r in rows if r["split"] == "train"}
    assert speed[6] > speed[4] / 3  # with the second of evaluation it was many times slower


def test_a_checkpoint_saved_at_a_signal_is_evaluated_by_a_resumed_run_that_stops_at_once(
    corpus, tmp_path, monkeypatch
):
    """Stopped by a signal at update 8 and resumed with nothing left to train (max_steps=8, as a budget
    used up by the same update would): the resumed run evaluates the checkpoint the signal saved."""
    run = tmp_path / "run"
    _sigterm_at_update_8(monkeypatch, tiny_args(corpus, run, "max_steps=15", "eval_every=5"))
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", "eval_every=5"), "--resume"]) == 0
    valid = [
        json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"valid"' in x
    ]
    assert valid == [5, 8]


def test_non_finite_loss_stops_with_a_clear_message_and_keeps_the_last_checkpoint(corpus, tmp_path):
    run = tmp_path / "run"
    trainer = Trainer(load_recipe(None, tiny_args(corpus, run, "max_steps=10", "eval_every=3")))
    real_loss = trainer.task.loss

    def poisoned(model, batch, smoothing):
        loss, nll, n = real_loss(model, batch, smoothing)
        return (loss * float("nan"), nll, n) if trainer.step >= 4 else (loss, nll, n)

    trainer.task.loss = poisoned
    with pytest.raises(
        TrainingDiverged,
        match="loss is nan at step 5; the last good checkpoint is .*step-000003; --resume would diverge "
        "again there: start a new run in another out_dir with a lower lr",
    ):
        trainer.fit()
    assert load_model(run / "step-000003").config.d_model == 32


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["lrr=1"], "unknown key 'lrr'"),
        (["lr=fast"], "lr must be float, got 'fast'"),
        (["model.d_modle=3"], r"unknown field\(s\) \['d_modle'\]"),
        (["model.d_model=33"], "d_model=33 must be divisible by n_heads=2"),
        (["dataset=/nonexistent/corpus"], "corpus.de: no such file"),
        (["task=poetry"], "task='poetry' is not one of"),
        (["task=lm", "max_epochs=2"], "max_epochs=2: task='lm' samples its training data endlessly"),
    ],
)
def test_bad_configuration_is_one_line_and_leaves_nothing(corpus, tmp_path, capsys, args, message):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=1"), *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("aiayn train: error:") and "\n" not in err
    assert __import__("re").search(message, err), err
    assert not run.exists()


def test_a_translation_corpus_without_a_validation_split_needs_valid_dataset(corpus, tmp_path, capsys):
    """A file prefix (``train.de``, ``train.en``) is one corpus: its "valid" split was the training
    files again, so validation BLEU, the best checkpoint and patience measured the training pairs."""
    run = tmp_path / "run"
    args = tiny_args(corpus, run, "max_steps=1")
    assert main(["train", *args, f"dataset={corpus / 'train'}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("aiayn train: error:") and "\n" not in err, err
    assert "is one corpus (train.de, train.en) without a validation split: give valid_dataset=" in err, err
    assert not run.exists()
    assert main(["train", *args, f"dataset={corpus / 'train'}", f"valid_dataset={corpus / 'valid'}"]) == 0


def _replace_line(path, index: int, text: str) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[index] = text
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_validation_pair_over_learned_positions_is_named_before_any_update(corpus, tmp_path, capsys):
    """Training drops pairs longer than max_len; validation keeps every pair, and one longer than the
    learned positions used to stop the run at its first evaluation (the embedding's DataError)."""
    run = tmp_path / "run"  # the corpus' validation pairs are longer than 19 pieces; training drops those
    args = tiny_args(corpus, run, "max_steps=2", "eval_every=2", "max_len=19", "model.positional=learned",
                     "model.max_len=20", "max_tokens=4096")  # fmt: skip
    assert main(["train", *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the line on training pairs over max_len
    assert err.startswith("aiayn train: error:"), err
    assert "validation line 2 needs 23 ids" in err and "over model.max_len=20" in err, err
    assert "raise model.max_len or shorten those lines" in err, err
    assert not (run / "metrics.jsonl").exists()


def test_a_validation_pair_over_max_tokens_is_named_before_any_update(corpus, tmp_path, capsys):
    """Validation keeps every pair; one that cannot fit a batch used to end the run at its first
    evaluation, after eval_every updates, with a message about a pair index and CorpusFilter."""
    _replace_line(corpus / "valid.de", 2, " ".join(["hund katze"] * 40))
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=2", "eval_every=2", "max_tokens=64")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("aiayn train: error:") and "\n" not in err, err
    assert "valid.de" in err and "validation line 3 needs" in err and "max_tokens=64" in err, err
    assert not (run / "metrics.jsonl").exists()


def test_a_training_pair_longer_than_a_batch_is_dropped_not_fatal(corpus, tmp_path):
    """max_len (256) allows the pair, max_tokens=64 cannot batch it: it is dropped as max_len drops."""
    _replace_line(corpus / "train.de", 5, " ".join(["hund katze"] * 10))  # ≈ 80 pieces: under max_len
    _replace_line(corpus / "train.en", 5, " ".join(["dog cat"] * 10))  # a translation: no ratio filter
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=2", "eval_every=2", "max_tokens=64")]) == 0
    assert (run / "step-000002").is_dir()


def test_eval_max_sentences_over_the_validation_set_scores_the_whole_set(corpus, tmp_path):
    run = tmp_path / "run"
    args = ["max_steps=2", "eval_every=2", "eval_bleu=true", "eval_max_sentences=300"]  # 30 in the set
    assert main(["train", *tiny_args(corpus, run, *args)]) == 0
    valid = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in valid if r["split"] == "valid" and "bleu" in r] == [2]


def test_resume_refuses_an_incompatible_run_and_a_new_run_refuses_an_old_directory(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=2", "eval_every=2")]) == 0
    capsys.readouterr()
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", "model.d_ff=128"), "--resume"]) == 1
    assert "cannot resume" in capsys.readouterr().err
    assert main(["train", *tiny_args(corpus, run, "max_steps=4")]) == 1
    assert "already holds a run: pass --resume" in capsys.readouterr().err
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", "eval_every=2"), "--resume"]) == 0
    assert max(_train_losses(run)) == 4


def test_average_and_plot(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=6", "eval_every=2", "keep_last=5")]) == 0
    assert main(["average", str(run), "--last", "3"]) == 0
    averaged = load_model(run / "averaged")
    parts = [load_model(run / f"step-00000{i}") for i in (2, 4, 6)]
    states = [m.state_dict() for m in parts]
    for name, tensor in averaged.state_dict().items():  # every tensor, the mean of the three (float64)
        expected = sum(state[name].double() for state in states) / 3
        torch.testing.assert_close(tensor.double(), expected, msg=name, atol=1e-7, rtol=1e-6)
    assert not torch.equal(
        states[0]["encoder.layers.0.ff.w_1.weight"], states[2]["encoder.layers.0.ff.w_1.weight"]
    )
    assert (run / "averaged" / "src").is_dir()
    (run / "accuracy.png").write_bytes(b"a classifier's curve from an earlier run")
    assert main(["plot", str(run), "--out", str(run)]) == 0  # the default, named
    assert (run / "loss.png").stat().st_size > 1000 and (run / "lr.png").is_file()
    assert not (run / "accuracy.png").exists()  # the set is replaced: no stale curve beside the new ones
    mine = tmp_path / "mine"  # a metrics file in a folder of the user's: written into only with --out
    mine.mkdir()
    (mine / "loss.png").write_bytes(b"the user's own figure")
    (mine / "m.jsonl").write_bytes((run / "metrics.jsonl").read_bytes())
    capsys.readouterr()
    assert main(["plot", str(mine / "m.jsonl")]) == 1
    assert "not in a training run directory; give --out" in capsys.readouterr().err
    assert (mine / "loss.png").read_bytes() == b"the user's own figure"
    assert main(["plot", str(mine / "m.jsonl"), "--out", str(mine)]) == 1  # the folder is the user's too
    assert "m.jsonl" in capsys.readouterr().err
    assert (mine / "loss.png").read_bytes() == b"the user's own figure"
    assert main(["plot", str(mine / "m.jsonl"), "--out", str(tmp_path / "figs")]) == 0


def test_a_checkpoint_that_prune_was_killed_deleting_is_left_as_a_temporary(tmp_path, monkeypatch):
    """rmtree deletes file by file; killed after trainer_state.json went, it left step-000001 with
    its weights and no state: no longer a checkpoint, so never pruned or cleaned up again."""
    from aiayn import temporaries
    from aiayn.temporaries import TMP_PREFIX

    for step in (1, 2, 3):
        folder = tmp_path / f"step-{step:06d}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"weights")

    def killed(path):
        (Path(path) / "trainer_state.json").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(temporaries.shutil, "rmtree", killed)  # prune deletes through remove_tree
    with pytest.raises(KeyboardInterrupt):
        ckpt.prune(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000002", "step-000003"]
    (left,) = [p for p in tmp_path.iterdir() if not p.name.startswith("step-")]
    assert left.name.startswith(TMP_PREFIX + "step-000001-")  # what remove_temporaries deletes


def test_a_checkpoint_is_on_the_disk_before_its_name_and_older_ones_go_after_both(
    corpus, tmp_path, monkeypatch
):
    """A machine crash (not only a killed process) must not leave a named but empty checkpoint once the
    older ones are pruned: every file of ``step-N`` is flushed before the rename, the run directory
    (the new name, then the new ``best`` link) after it, and only then does ``prune`` delete."""
    from aiayn import atomic

    events, real_sync, real_replace = [], atomic.sync, atomic.replace_dir

    def sync(path):
        events.append(("sync", Path(path).name))
        real_sync(path)

    def replace_dir(new, path):
        events.append(("rename", Path(path).name))
        real_replace(new, path)

    monkeypatch.setattr(atomic, "sync", sync)
    monkeypatch.setattr(ckpt, "sync", sync)
    monkeypatch.setattr(atomic, "replace_dir", replace_dir)
    monkeypatch.setattr(ckpt, "prune", lambda run_dir, keep: events.append(("prune", run_dir.name)))
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=2", "eval_every=2")]) == 0
    at = events.index(("rename", "step-000002"))
    flushed = {name for kind, name in events[:at] if kind == "sync"}
    files = {p.name for p in (run / "step-000002").rglob("*")}
    assert files and files <= flushed, files - flushed
    assert events[at + 1 : at + 3] == [("sync", "run"), ("sync", "run")]  # the name; the best link
    assert events[at + 3] == ("prune", "run")


def test_marking_the_best_replaces_a_planted_link_not_the_file_it_points_to(tmp_path):
    run, victim = tmp_path / "run", tmp_path / "bashrc"
    (run / "step-000100").mkdir(parents=True)
    victim.write_text("precious")
    (run / "best").symlink_to(victim)
    ckpt.mark_best(run, run / "step-000100")
    assert victim.read_text() == "precious" and os.readlink(run / "best") == "step-000100"
    (run / "best").unlink()
    (run / "best").write_text("not a link")
    with pytest.raises(ModelDirError, match="not the link aiayn keeps"):
        ckpt.mark_best(run, run / "step-000100")


def test_average_of_more_checkpoints_than_kept_warns_and_leaves_out_an_older_best(corpus, tmp_path, capsys):
    """What a run with keep_last=2 whose first evaluation stayed the best leaves: step 2 (best), 6 and 8.
    --last 5 averages the two newest, says so, and does not reach back to step 2."""
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", "eval_every=2", "keep_last=5")]) == 0
    ckpt.mark_best(run, run / "step-000002")
    ckpt.prune(run, 2)
    config = json.loads((run / "train_config.json").read_text())
    (run / "train_config.json").write_text(json.dumps({**config, "keep_last": 2}))
    capsys.readouterr()
    assert main(["average", str(run), "--last", "5"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"aiayn: warning: {run} keeps only 2 recent checkpoint(s), not --last 5: averaging those "
                   "(see keep_last)"]  # fmt: skip
    averaged = json.loads((run / "averaged" / "config.json").read_text())["averaged"]
    assert [Path(p).name for p in averaged] == ["step-000006", "step-000008"]
    shutil.copytree(run / "step-000008", run / "step-000010")
    (run / "step-000010" / "trainer_state.json").unlink()  # a model kept without its state: left out, said
    assert main(["average", str(run), "--last", "2", "--force"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"aiayn: warning: step-000010 in {run} lack(s) trainer_state.json (not a complete "
                   "checkpoint): left out; the newest averaged is step-000008"]  # fmt: skip
    (run / "train_config.json").write_text("{")  # before: "…; resume cannot go on", from aiayn average
    assert main(["average", str(run), "--last", "2", "--force"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("restore it: it says which checkpoints the run kept"), err


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes").glob("*.toml")), ids=lambda p: p.name)
def test_every_recipe_is_valid(recipe):
    cfg = load_recipe(recipe)
    assert cfg.out_dir.startswith("runs/")


def test_the_demo_config_loads_from_the_recipe(tmp_path):
    """``aiayn demo`` overrides the de→en recipe's schedule: the result must still be a valid config."""
    from aiayn.cli.demo import demo_config

    cfg = demo_config(tmp_path / "demo", 10)
    assert (cfg.schedule, cfg.horizon, cfg.max_minutes) == ("inverse_sqrt", "steps", 10)


def test_the_demo_compares_its_speed_and_tells_a_slower_machine_how_long_to_train():
    """0.74 updates/s against the README's 1,496 updates at 2.49/s: 0.30× as fast, and 34 minutes for them."""
    from aiayn.cli.demo import against_references

    readme = {"bleu": 33.61, "updates": 1496, "minutes": 10.0, "updates_per_s": 2.49, "machine": "A"}
    refs = [readme, {**readme, "bleu": 22.28, "updates": 874, "updates_per_s": 1.46, "machine": "B"}]
    slow = against_references(0.74, refs)
    assert "came from 2.49 updates/s on A: this machine ran 0.30× as fast" in slow[0]
    assert "this machine ran 0.51× as fast" in slow[1]
    assert slow[2].endswith("1,496 updates at this machine's speed: .venv/bin/aiayn demo --minutes 34")
    assert len(against_references(2.4, refs)) == 2 and against_references(0.74, []) == []


def test_the_machine_says_which_instruction_set_limits_were_in_force(monkeypatch):
    """A figure measured with ATen/fbgemm/MKL/oneDNN held to AVX2 must not read as the unrestricted
    machine's."""
    from aiayn.cli.demo import ISA_LIMITS, machine

    for name in ISA_LIMITS:
        monkeypatch.delenv(name, raising=False)
    plain = machine()
    assert "limited by" not in plain and plain.endswith(f"torch {torch.__version__}")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert machine() == f"{plain}, limited by ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")  # int8's kernels
    limits = "ATEN_CPU_CAPABILITY=avx2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2"
    assert machine() == f"{plain}, limited by {limits}"


def test_the_machine_names_the_widest_vector_instructions_of_the_first_cpu():
    """Two VMs that both call themselves "AMD EPYC" differ 3× in speed: the flags tell them apart, and
    the family and model numbers tell apart two generations with the same flags."""
    from aiayn.cli.demo import describe_cpu

    def block(model, flags):
        return f"processor\t: 0\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"

    zen1, zen4 = block("AMD EPYC", "fpu sse2 avx fma avx2"), block("AMD EPYC", "avx2 avx512f avx512_bf16")
    assert describe_cpu(zen1 + block("Other", "avx2 avx512f amx_bf16")) == "AMD EPYC (AVX2)"
    assert describe_cpu(zen4) == "AMD EPYC (AVX-512 BF16)"
    assert describe_cpu(block("Intel Xeon", "avx2 avx512f avx512_bf16 amx_bf16")) == "Intel Xeon (AMX)"
    assert describe_cpu(block("Intel Xeon", "avx2 avx512f")) == "Intel Xeon (AVX-512)"
    assert describe_cpu(block("Old", "sse2 avx")) == "Old"
    zen5 = "processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\nflags\t\t: avx512_bf16\n"
    assert describe_cpu(zen5) == "AMD EPYC family 26 model 2 (AVX-512 BF16)"  # Zen 5, where Zen 4 says 25


def test_a_run_directory_translates_and_evaluates(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", "eval_every=4")]) == 0
    src = tmp_path / "in.de"
    src.write_text("hund läuft\n\nkatze sitzt\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["translate", "--model", str(run), "--input", str(src), "--beam", "2", "--max-len", "5"]) == 0
    assert len(capsys.readouterr().out.split("\n")) == 4  # three lines in, three lines out
    meta = json.loads((run / "best" / "config.json").read_text())
    assert (meta["src_lang"], meta["tgt_lang"], meta["task"]) == ("de", "en", "translation")


def test_precision_auto_times_a_language_models_own_batch(tmp_path, monkeypatch):
    """An LM batches batch_size windows of block_size tokens; auto timed max_tokens rows (4,096 by
    default, unrelated to the run), so max_tokens, which nothing else reads there, picked its precision."""
    measured = []
    monkeypatch.setattr(precision, "bf16_speedup", lambda *a: measured.append(a) or 1.0)
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question.\n" * 40, encoding="utf-8")
    args = ["task=lm", f"dataset={text}", "tokenizer=char", f"out_dir={tmp_path / 'lm'}", "max_steps=1",
            "batch_size=3", "block_size=16", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
            "model.n_layers=1", "progress=false", "threads=1", "precision=auto"]  # fmt: skip
    assert main(["train", *args]) == 0
    assert len(measured) == 1 and measured[0][1:] == (48, 32, 64)  # 3 windows × 16, d_model, d_ff


def test_a_language_model_run_generates(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question.\n" * 40, encoding="utf-8")
    run = tmp_path / "lm"
    args = [
        "task=lm", f"dataset={text}", "tokenizer=char", f"out_dir={run}", "max_steps=3", "eval_every=3",
        "batch_size=4", "block_size=16", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
        "model.n_layers=1", "schedule=constant", "lr=0.003", "warmup=1", "progress=false", "threads=1",
    ]  # fmt: skip
    assert main(["train", *args]) == 0
    valid = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"valid"' in x]
    assert valid and valid[-1]["ppl"] > 1
    capsys.readouterr()
    assert json.loads((run / "best" / "config.json").read_text())["trained_max_len"] == 16  # block_size
    new = 40  # past the 16 trained positions: generation reads the last 16 characters
    generate = ["generate", "--model", str(run), "--prompt", "to be", "--max-new-tokens", str(new)]
    assert main([*generate, "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("to be")
    (hyp,) = Generator.from_dir(run).complete("to be", new, SearchConfig(beam=1, min_len=new))
    assert len(hyp.tokens) == new


@pytest.mark.parametrize(
    "case, message",
    [
        ("beam", "beam=0 must be at least 1"),
        ("json-over-input", "--json"),
        ("bad-reference", "is not valid JSON"),
        ("wrong-reference", "is not a list of demo runs"),
        ("no-recipe", "no-such-recipe.toml"),
        ("no-data", "AIAYN_DATA_DIR points to"),
        ("busy", "is in use by another training"),  # a demo still training there: deleted under it
        ("json-inside-out", "is inside --out"),  # written after training, over the new run's own files
    ],
)
def test_the_demo_refuses_bad_options_and_files_before_it_trains_or_replaces_the_last_demo(
    case, message, tmp_path, monkeypatch, capsys
):
    import aiayn.cli.demo as demo

    reference = tmp_path / "demo.json"
    reference.write_text({"bad-reference": "[{", "wrong-reference": '{"bleu": 1}'}.get(case, "[]"))
    monkeypatch.setattr(demo, "REFERENCE", reference)
    if case == "no-recipe":
        monkeypatch.setattr(demo, "RECIPE", tmp_path / "no-such-recipe.toml")
    if case == "no-data":  # e.g. a wrong AIAYN_DATA_DIR: found out before the last demo is gone
        monkeypatch.setenv("AIAYN_DATA_DIR", str(tmp_path / "no-data"))
    out = tmp_path / "demo"
    out.mkdir()
    (out / demo.DEMO_MARK).write_text("the last demo")
    from aiayn.training.rundir import RunLock

    held = RunLock(out, str(out)) if case == "busy" else None  # as the other demo's trainer holds it
    args = ["demo", "--out", str(out), "--minutes", "0.05"]
    args += {"beam": ["--beam", "0"], "json-over-input": ["--json", str(reference)],
             "json-inside-out": ["--json", str(out / "metrics.jsonl")]}.get(case, [])  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "aiayn demo: training" not in err
    assert (out / demo.DEMO_MARK).read_text() == "the last demo"  # nothing replaced
    if held is not None:
        held.release()


def test_training_pairs_the_filters_drop_are_counted_on_stderr(corpus, tmp_path, capsys):
    """Before, the counts were only in the data cache's meta.json: a quarter of a corpus could go unsaid."""
    de, en = (corpus / "train.de").read_text().splitlines(), (corpus / "train.en").read_text().splitlines()
    de[:3], en[3:5] = [" ".join(["hund"] * 300)] * 3, ["", " "]  # 3 over max_len, 2 with an empty side
    (corpus / "train.de").write_text("\n".join(de) + "\n")
    (corpus / "train.en").write_text("\n".join(en) + "\n")
    assert main(["train", *tiny_args(corpus, tmp_path / "run", "max_steps=1", "eval_every=1")]) == 0
    said = "kept 395 of 400 pairs (dropped 2 empty, 3 over max_len, 0 over max_ratio)"
    assert said in capsys.readouterr().err
    (tmp_path / "clean").mkdir()
    assert main(["train", *tiny_args(make_corpus(tmp_path / "clean"), tmp_path / "r2", "max_steps=1")]) == 0
    assert "pairs (dropped" not in capsys.readouterr().err  # nothing dropped, nothing said


def test_average_refuses_checkpoints_whose_tensors_differ(corpus, tmp_path, capsys):
    """Before, a tensor missing from an older checkpoint was averaged as if it were zero there (the
    average halved, exit 0), and one of another shape broadcast or raised a traceback."""
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", "eval_every=2", "keep_last=5")]) == 0
    older = run / "step-000002" / "model.safetensors"
    weights, name = load_file(str(older)), "decoder.layers.0.ff_res.norm.bias"
    for edited, said in (({k: v for k, v in weights.items() if k != name}, "is missing, in"),
                         ({**weights, name: weights[name][:5]}, "is (5,), in")):  # fmt: skip
        save_file(edited, str(older), metadata={"format": "pt"})
        capsys.readouterr()
        assert main(["average", str(run), "--last", "2", "--force"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"step-000002/model.safetensors: {name} {said}" in err[0], err
        assert not (run / "averaged").exists()


@pytest.mark.parametrize(
    "line, refused",
    [
        (
            '{"split": "train", "step": 1, "loss": ' + "9" * 5000 + "}",
            True,
        ),  # an int past Python's 4300 digits
        ("[" * 100_000, True),  # nested past the recursion limit
        (
            '{"split": "train", "step": 1, "loss": 1e308}\n{"split": "train", "step": 2, "loss": -1e308}',
            False,
        ),
        ('{"split": "train", "step": 3, "loss": ' + "9" * 400 + "}", False),  # an int past float's range
    ],
)
def test_plot_of_odd_metrics_is_one_line_or_a_figure_without_the_odd_values(tmp_path, capsys, line, refused):
    """Before: a ValueError, RecursionError or OverflowError traceback."""
    metrics = tmp_path / "m.jsonl"
    good = [{"split": "train", "step": s, "loss": 5.0 - s, "lr": 0.001} for s in (4, 5)]
    metrics.write_text("\n".join([line, *map(json.dumps, good)]) + "\n")
    assert main(["plot", str(metrics), "--out", str(tmp_path / "figs")]) == int(refused)
    err = capsys.readouterr().err.strip().splitlines()
    if refused:
        assert len(err) == 1 and "m.jsonl: line 1 is not valid JSON" in err[0], err
    else:
        assert (tmp_path / "figs" / "loss.png").stat().st_size > 1000


def test_plot_leaves_out_a_last_line_cut_short_and_refuses_one_in_the_middle(tmp_path, capsys):
    """A run killed mid-write ends its metrics in half a line (its resume drops it); plot refused the
    whole file, just when its curves were wanted. Half a line before others is still refused."""
    good = [json.dumps({"split": "train", "step": s, "loss": 5.0 - s, "lr": 0.001}) for s in (1, 2)]
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("\n".join(good) + '\n{"split": "tra')
    assert main(["plot", str(metrics), "--out", str(tmp_path / "figs")]) == 0
    assert capsys.readouterr().err.strip() == f"aiayn: warning: {metrics}: line 3 is cut short: left out"
    assert (tmp_path / "figs" / "loss.png").stat().st_size > 1000
    metrics.write_text(good[0] + '\n{"split": "tra\n' + good[1] + "\n")
    assert main(["plot", str(metrics), "--out", str(tmp_path / "figs2")]) == 1
    assert "line 2 is not valid JSON" in capsys.readouterr().err
