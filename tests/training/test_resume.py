"""Resuming where fairseq and OpenNMT users expect: from the newest checkpoint that loads (with a
warning naming the ones skipped), from a run directory that was moved, and a run that stopped
before its first checkpoint starts again instead of blocking its directory."""

import contextlib
import json
import os
import shutil

import pytest

from aiayn.cli.main import main
from aiayn.errors import ConfigError
from aiayn.training.config import to_dict
from aiayn.training.recipe import load_recipe
from aiayn.training.rundir import check_resume_compatible
from tests.training.conftest import tiny_args

ARGS = ["eval_every=2", "keep_last=5", "model.dropout=0.3"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))


def _losses(run) -> dict[int, float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["split"] == "train"}


def _edit_state(checkpoint, key, value):
    path = checkpoint / "trainer_state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))


@pytest.fixture
def reference(corpus, tmp_path):
    """An uninterrupted 8-step run: what every resumed run below must equal, loss for loss."""
    assert main(["train", *tiny_args(corpus, tmp_path / "ref", "max_steps=8", *ARGS)]) == 0
    return _losses(tmp_path / "ref")


@pytest.mark.parametrize(
    "damage",
    [
        lambda ckpt: (ckpt / "trainer_state.safetensors").write_bytes(b"\x00" * 7),
        lambda ckpt: (ckpt / "trainer_state.json").write_text('{"step": 6, "best"'),
        lambda ckpt: (ckpt / "model.safetensors").unlink(),
        # fields a resumed run trusted: a step of "x" or 2.5 was a traceback (metrics.jsonl rewritten
        # first), 3 or true resumed with a wrong step counter, 1e400 stopped "at step inf"
        *[lambda ckpt, v=v: _edit_state(ckpt, "step", v) for v in ("x", 2.5, 3, True, None)],
        lambda ckpt: _edit_state(ckpt, "elapsed", -1.0),
        lambda ckpt: _edit_state(ckpt, "bad_evals", "2"),
    ],
    ids=[
        "state-tensors-truncated",
        "state-json-truncated",
        "weights-missing",
        "step-str",
        "step-float",
        "step-other",
        "step-bool",
        "step-null",
        "elapsed-negative",
        "bad-evals-str",
    ],  # fmt: skip
)
def test_resume_falls_back_to_the_newest_checkpoint_that_loads(corpus, tmp_path, capsys, reference, damage):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=6", *ARGS)]) == 0
    damage(run / "step-000006")
    capsys.readouterr()
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", *ARGS), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "warning: skipping checkpoint step-000006" in err and "resuming" in err and "step-000004" in err
    assert _losses(run) == reference  # continued exactly from step 4


@pytest.mark.parametrize(
    "failure",
    [lambda: OSError(5, "Input/output error"), lambda: __import__("torch").OutOfMemoryError("out of memory")],
    ids=["eio", "oom"],
)
def test_a_machine_failure_while_loading_is_no_reason_to_go_back(corpus, tmp_path, capsys, monkeypatch,
                                                                 failure):  # fmt: skip
    """A read that fails for the machine's reasons (an I/O error, memory) stops the resume: the newest
    checkpoint is fine, and falling back to an older one would drop its updates (under torchrun, on
    that rank alone). It is neither skipped nor set aside."""
    import safetensors.torch

    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=6", *ARGS)]) == 0

    def broken(*args, **kwargs):
        raise failure()

    monkeypatch.setattr(safetensors.torch, "load_model", broken)
    capsys.readouterr()
    with contextlib.suppress(RuntimeError):  # out of memory is a RuntimeError: a traceback, as it should be
        assert main(["train", *tiny_args(corpus, run, "max_steps=8", *ARGS), "--resume"]) == 1
    err = capsys.readouterr().err
    assert "skipping" not in err and "resuming" not in err
    assert sorted(p.name for p in run.glob("step-*")) == ["step-000002", "step-000004", "step-000006"]


def test_ranks_that_loaded_different_checkpoints_stop_with_one_line(corpus, tmp_path, capsys, monkeypatch):
    """Under torchrun each rank loads the checkpoints itself; one whose read of the newest failed would
    go on from an older step, shard and optimiser state than the others. Every rank's step is compared
    (``disagreement``) and a difference stops the resume before anything is set aside."""
    import torch

    from aiayn.training import distributed, trainer

    cpu, info = torch.device("cpu"), distributed.DistInfo(0, 0, 2)
    assert distributed.disagreement(6, distributed.DistInfo(), cpu) is None  # one process
    with monkeypatch.context() as m:
        m.setattr(distributed, "all_gather", lambda v, i, d: [v, torch.tensor([4])])
        assert distributed.disagreement(6, info, cpu) == [6, 4]
        assert distributed.disagreement(4, info, cpu) is None
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=6", *ARGS)]) == 0
    monkeypatch.setattr(trainer, "disagreement", lambda step, i, d: [step, 4])
    capsys.readouterr()
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", *ARGS), "--resume"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("the ranks loaded different checkpoints (steps [6, 4], by rank; the warnings "
                            "above say why): mend or remove the newer one")  # fmt: skip
    assert sorted(p.name for p in run.glob("step-*")) == ["step-000002", "step-000004", "step-000006"]


def test_a_run_whose_tokenizer_was_replaced_is_not_resumed_on_other_ids(corpus, tmp_path, capsys, reference):
    """A run's tokenizer folder replaced by one of the same size (here: a unigram vocabulary, as another
    sentencepiece might train it again): the weights would load and train on other pieces. Compared with
    the checkpoint's copy, it is refused in one line; with its own back, the run resumes exactly."""
    run, other = tmp_path / "run", tmp_path / "other"
    assert main(["train", *tiny_args(corpus, run, "max_steps=6", *ARGS)]) == 0
    assert main(["train", *tiny_args(corpus, other, "max_steps=2", "tokenizer=unigram", *ARGS)]) == 0
    own = tmp_path / "own"
    shutil.move(run / "tokenizer", own)
    shutil.copytree(other / "tokenizer", run / "tokenizer")
    capsys.readouterr()
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", *ARGS), "--resume"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("aiayn train: error: cannot resume") and "not the one step-000006 was" in err
    assert "\n" not in err and "skipping" not in err
    shutil.rmtree(run / "tokenizer")
    shutil.move(own, run / "tokenizer")
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", *ARGS), "--resume"]) == 0
    assert _losses(run) == reference


def test_a_checkpoint_skipped_on_resume_is_set_aside_not_counted_by_pruning(corpus, tmp_path, capsys):
    """A newer checkpoint that did not load stayed in place: keep_last pruning counted it (and deleted the
    good ones), and best still pointed at it, so the next --resume found nothing that loads."""
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=6", "eval_every=2", "keep_last=2")]) == 0
    (run / "step-000006" / "model.safetensors").unlink()
    args = tiny_args(corpus, run, "max_steps=8", "eval_every=2", "keep_last=1")
    assert main(["train", *args, "--resume"]) == 0
    assert sorted(p.name for p in run.glob("step-*")) == ["step-000006.unloaded-" + str(os.getpid()),
                                                           "step-000008"]  # fmt: skip
    assert (run / "best").resolve().name.startswith("step-0000")  # a checkpoint that loads
    assert (
        main(["train", *tiny_args(corpus, run, "max_steps=10", "eval_every=2", "keep_last=1"), "--resume"])
        == 0
    )


def test_best_marked_after_a_kill_between_the_checkpoint_and_its_link(corpus, tmp_path, monkeypatch):
    """The best checkpoint is written, then linked: a kill between the two left best on a worse one for
    good (and keep_last could then delete the real best)."""
    from aiayn.training import checkpoint as ckpt

    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=2", "eval_every=2")]) == 0
    real = ckpt.mark_best
    monkeypatch.setattr(ckpt, "mark_best", lambda run_dir, path: None)  # as if killed before the link
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", "eval_every=2"), "--resume"]) == 0
    state = json.loads((run / "step-000004" / "trainer_state.json").read_text())
    assert state["is_best"] and (run / "best").resolve().name == "step-000002"
    monkeypatch.setattr(ckpt, "mark_best", real)
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", "eval_every=2"), "--resume"]) == 0
    assert (run / "best").resolve().name == "step-000004"


def test_resume_with_no_loadable_checkpoint_is_one_line(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", *ARGS)]) == 0
    for ckpt in run.glob("step-*"):
        (ckpt / "trainer_state.safetensors").write_bytes(b"")
    assert main(["train", *tiny_args(corpus, run, "max_steps=6", *ARGS), "--resume"]) == 1
    assert "no checkpoint loads" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_moved_run_resumes(corpus, tmp_path, reference):
    assert main(["train", *tiny_args(corpus, tmp_path / "old", "max_steps=4", *ARGS)]) == 0
    shutil.move(tmp_path / "old", tmp_path / "new")
    assert main(["train", *tiny_args(corpus, tmp_path / "new", "max_steps=8", *ARGS), "--resume"]) == 0
    assert _losses(tmp_path / "new") == reference


@pytest.mark.parametrize("tokenizer", ["bpe", "unigram"])
def test_a_checkpoint_of_another_run_is_skipped(corpus, tmp_path, capsys, reference, tokenizer):
    """Another run's checkpoint is skipped, whatever its tokenizer (one of another vocabulary stopped the
    resume when the run's tokenizer was compared with it before its run_id)."""
    run, other = tmp_path / "run", tmp_path / "other"
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", *ARGS)]) == 0
    assert main(["train", *tiny_args(corpus, other, "max_steps=6", f"tokenizer={tokenizer}", *ARGS)]) == 0
    shutil.copytree(other / "step-000006", run / "step-000006")  # same settings, another run
    capsys.readouterr()
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", *ARGS), "--resume"]) == 0
    assert "belongs to another run" in capsys.readouterr().err
    assert _losses(run) == reference


@pytest.mark.parametrize("resume", [[], ["--resume"]], ids=["again", "resume"])
def test_a_run_that_stopped_before_its_first_checkpoint_starts_again(corpus, tmp_path, capsys, resume):
    """What a crash before the first checkpoint leaves (settings, a few metrics, a tokenizer and
    BPE-dropout samples made with other settings) blocks nothing: the run starts again, with the new
    settings and samples drawn anew."""
    run = tmp_path / "run"
    first = ["max_steps=2", "eval_every=100", "vocab_size=400", "subword_dropout=0.1", "seed=1"]
    assert main(["train", *tiny_args(corpus, run, *first)]) == 0
    old_sample = (run / "subword" / "segmentation-0.npz").read_bytes()
    for ckpt in run.glob("step-*"):
        shutil.rmtree(ckpt)
    (run / "best").unlink()
    capsys.readouterr()
    again = ["max_steps=2", "eval_every=2", "subword_dropout=0.1", "seed=2"]
    assert main(["train", *tiny_args(corpus, run, *again), *resume]) == 0
    assert "has no checkpoint: starting it again" in capsys.readouterr().err
    saved = json.loads((run / "train_config.json").read_text())
    assert saved["vocab_size"] == 300 and saved["eval_every"] == 2  # the new settings, a new tokenizer
    assert (run / "subword" / "segmentation-0.npz").read_bytes() != old_sample  # drawn with seed 2
    assert sorted(_losses(run)) == [1, 2] and (run / "step-000002").is_dir()


def test_a_torn_metrics_line_does_not_stop_a_resume(corpus, tmp_path, reference):
    """A run killed while appending to metrics.jsonl leaves half a line; resume drops it."""
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", *ARGS)]) == 0
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('[1]\n{"step": 5, "spl')
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", *ARGS), "--resume"]) == 0
    assert _losses(run) == reference


def test_resume_with_another_number_of_processes_is_refused(corpus, tmp_path, capsys, reference):
    """Each process trains on its shard of the data: resumed by another number of processes, the
    shards would repeat and skip examples. A checkpoint from before the count was saved resumes."""
    run = tmp_path / "run"
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", *ARGS)]) == 0
    state_file = run / "step-000004" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["world_size"] == 1
    state_file.write_text(json.dumps({**state, "world_size": 2}))  # as two processes under torchrun save it
    capsys.readouterr()
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", *ARGS), "--resume"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("step-000004 was trained by 2 process(es), not 1; resume with --nproc_per_node=2 "
                            "(torchrun)"), err  # fmt: skip
    state_file.write_text(json.dumps({k: v for k, v in state.items() if k != "world_size"}))
    assert main(["train", *tiny_args(corpus, run, "max_steps=8", *ARGS), "--resume"]) == 0
    assert _losses(run) == reference


ENDS = "sets where this run's cosine ends"


@pytest.mark.parametrize(
    ("run", "resumed", "refused"),
    [
        (["max_steps=100"], ["max_steps=200"], rf"max_steps {ENDS} \(decay_steps=0\): set decay_steps=100"),
        (["max_steps=100"], ["max_steps=200", "decay_steps=100"], None),  # the same cosine, then min_lr
        (["max_steps=100", "decay_steps=100"], ["max_steps=200", "decay_steps=100"], None),
        (["max_steps=100", "schedule=inverse_sqrt"], ["max_steps=200", "schedule=inverse_sqrt"], None),
        (["horizon=budget", "max_minutes=5"], ["horizon=budget", "max_minutes=10"],
         rf"max_minutes {ENDS} \(horizon='budget'\): resume with max_minutes=5.0"),
        (["max_minutes=5"], ["max_minutes=10"], None),  # a budget that only stops the run
        (["horizon=budget", "max_minutes=5", "max_steps=100"], ["horizon=budget", "max_minutes=5",
         "max_steps=200"], r"set decay_steps=100 to extend it \(under horizon='budget' that adds updates "
         r"only to a run that stopped at max_steps: one that used up its max_minutes stops at once"),
    ],
)  # fmt: skip
def test_a_resumed_cosine_keeps_where_it_ends(tmp_path, run, resumed, refused):
    """Before, a larger max_steps (or budget) moved the cosine's end, and the resumed run's learning
    rate jumped back up the curve."""
    cosine = ["schedule=cosine", "warmup=10", "out_dir=runs/x"]
    saved = to_dict(load_recipe(None, [*cosine, *run]))
    now = load_recipe(None, [*cosine, *resumed])
    if refused is None:
        check_resume_compatible(saved, now, tmp_path)
    else:
        with pytest.raises(ConfigError, match=refused):
            check_resume_compatible(saved, now, tmp_path)


def test_a_model_field_written_out_at_its_default_resumes_and_a_changed_one_is_named(tmp_path):
    model = ["model.d_model=32", "model.n_heads=2", "model.dropout=0.1"]
    saved = to_dict(load_recipe(None, model))
    check_resume_compatible(saved, load_recipe(None, [*model, "model.ff_dropout=0.0"]), tmp_path)
    with pytest.raises(ConfigError, match=r"model.ff_dropout was 0.0, now 0.2 \(1 incompatible field\(s\): "
                       r"model.ff_dropout\); resume with the run's settings"):  # fmt: skip
        check_resume_compatible(saved, load_recipe(None, [*model, "model.ff_dropout=0.2"]), tmp_path)


def test_resume_refuses_a_validation_set_cut_otherwise(tmp_path):
    """Before, eval_max_sentences could change on resume, and the best checkpoint and patience compared
    scores on 300 sentences with scores on the whole set."""
    saved = to_dict(load_recipe(None, ["eval_max_sentences=300"]))
    with pytest.raises(ConfigError, match=r"eval_max_sentences was 300, now 0 \(1 incompatible"):
        check_resume_compatible(saved, load_recipe(None, []), tmp_path)


def test_resume_checks_the_data_by_its_contents_not_by_how_its_path_is_spelt(corpus, tmp_path, capsys):
    """Before, edited data trained on silently, and the same data under another spelling of the path was
    refused (the dataset strings differed). A checkpoint from before the digests resumes as it did."""
    run, other_spelling = tmp_path / "run", f"dataset={corpus}/../{corpus.name}/"
    assert main(["train", *tiny_args(corpus, run, "max_steps=2", *ARGS)]) == 0
    original = (corpus / "valid.en").read_text(encoding="utf-8")
    (corpus / "valid.en").write_text(original.replace("dog", "cat", 1), encoding="utf-8")  # same lines
    capsys.readouterr()
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", *ARGS), "--resume"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    changed = f"the data changed: {corpus / 'valid.en'} differs from what the run read (sha256); restore"
    assert len(err) == 1 and changed in err[0], err
    (corpus / "valid.en").write_text(original, encoding="utf-8")
    assert main(["train", *tiny_args(corpus, run, "max_steps=4", *ARGS), other_spelling, "--resume"]) == 0
    state_file = run / "step-000004" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({k: v for k, v in state.items() if k != "data_files"}))  # as before
    capsys.readouterr()
    assert main(["train", *tiny_args(corpus, run, "max_steps=6", *ARGS), "--resume"]) == 1  # unverifiable
    assert "dataset is" in capsys.readouterr().err
    assert main(["train", *tiny_args(corpus, run, "max_steps=6", *ARGS), other_spelling, "--resume"]) == 0


def test_random_states_resume_on_fewer_gpus_or_from_a_cpu_run(monkeypatch):
    """A run saved with 4 GPUs visible, resumed with 1 (CUDA_VISIBLE_DEVICES=0): torch's
    set_rng_state_all indexed a generator per saved state and failed (IndexError) on the second. A
    run saved on the CPU, resumed on a GPU, had no CUDA state to restore for its rank (RuntimeError:
    every checkpoint "does not fit this run"). A fake CUDA of one device stands in for the GPU here."""
    import torch

    from aiayn.training import checkpoint as ckpt

    restored = []

    def set_rng_state(state, device=0):
        index = torch.device(device).index if not isinstance(device, int) else device
        if index >= 1 or state.numel() == 0:
            raise (IndexError if index >= 1 else RuntimeError)(f"device {device}, {state.numel()} bytes")
        restored.append((index, state[0].item()))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)
    cpu = torch.get_rng_state()
    meta = {"version": 3, "state": list(__import__("random").getstate()[1]), "gauss": None}
    saved = {f"rng.cuda.{i}": torch.full((16,), i, dtype=torch.uint8) for i in range(4)}
    ckpt._set_rng_state(meta, {"rng.torch": cpu, **saved})
    assert restored == [(0, 0)]  # device 0's state, the others' devices absent
    ckpt._set_rank_rng_state(cpu, torch.device("cuda", 0))  # a CPU run's rank state: the CPU part only
    assert restored == [(0, 0)] and torch.equal(torch.get_rng_state(), cpu)


def test_best_keeps_pointing_at_the_best_checkpoint_when_the_newest_is_set_aside(corpus, tmp_path):
    """Checkpoints 1 (best), 2 (worse) and 3 (better still, ``best``), then 3's trainer state lost:
    the resumed run starts from 2, and ``best`` points at 1, the best that is left (which ``prune``
    then keeps), not at 2."""
    from aiayn.training.trainer import Trainer

    run = tmp_path / "run"
    args = tiny_args(corpus, run, "max_steps=3", "eval_every=1", "keep_last=5")
    trainer = Trainer(load_recipe(None, args))

    trainer.task.score = lambda metrics: {1: 1.0, 2: 0.5, 3: 2.0}[trainer.step]  # 2 is worse, 3 better
    trainer.fit()
    assert os.readlink(run / "best") == "step-000003"
    (run / "step-000003" / "trainer_state.json").write_text("{")
    resumed = Trainer(load_recipe(None, args), resume=True)
    assert resumed.step == 2 and os.readlink(run / "best") == "step-000001"
    resumed.release()


def test_an_apple_gpus_random_state_is_saved_and_restored(tmp_path, monkeypatch):
    """On MPS dropout draws from the device's own generator: a checkpoint holds it and a resume
    restores it, as CUDA's (only the CPU's was saved: a resumed MPS run drew other dropout masks). An
    MPS run is one process (torchrun refuses it), so the run's own state carries it, and the rank
    state too. A fake MPS generator stands in."""
    import torch

    from aiayn.training import checkpoint as ckpt

    generator = {"state": torch.arange(8, dtype=torch.uint8)}
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "get_rng_state", lambda: generator["state"].clone())
    monkeypatch.setattr(torch.mps, "set_rng_state", lambda state: generator.update(state=state))
    from aiayn import LanguageModel, LMConfig

    model = LanguageModel(LMConfig(vocab_size=12, n_layers=1, d_model=8, n_heads=2, d_ff=16))
    optimizer = torch.optim.Adam(model.parameters())
    state = {"step": 3, "best": None, "bad_evals": 0, "elapsed": 1.0, "sampler": {}}
    path = ckpt.save_checkpoint(tmp_path, 3, model, optimizer, state)
    generator["state"] = torch.zeros(8, dtype=torch.uint8)  # the resumed process's fresh generator
    ckpt.load_checkpoint(path, model, optimizer)
    assert generator["state"].tolist() == list(range(8))
    mps = torch.device("mps")
    saved = ckpt.rank_rng_state(mps)
    generator["state"] = torch.zeros(8, dtype=torch.uint8)
    ckpt._set_rank_rng_state(saved, mps)
    assert generator["state"].tolist() == list(range(8))
    ckpt._set_rank_rng_state(torch.get_rng_state(), mps)  # a CPU run's state: the CPU part only
    assert generator["state"].tolist() == list(range(8))
