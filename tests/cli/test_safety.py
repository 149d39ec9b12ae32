"""Nothing a user gets wrong destroys data or shows a traceback.

Each case is a command a user might type with something wrong in it. It must exit with status 1,
print exactly one line ``aiayn CMD: error: …`` naming the file or field, and leave every file that
existed before byte-for-byte as it was (the whole workspace is hashed before and after).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from aiayn.cli.main import main
from tests.decoding.fixtures import lm_dir, translation_dir

DE = ["ein mann fährt", "zwei hunde spielen", "eine frau liest"]
EN = ["a man rides", "two dogs play", "a woman reads"]
TINY_TRAIN = ["vocab_size=60", "max_tokens=64", "eval_bleu=false", "model.d_model=16", "model.n_heads=2",
              "model.d_ff=32", "model.n_encoder_layers=1", "model.n_decoder_layers=1", "progress=false",
              "max_steps=2", "eval_every=2"]  # fmt: skip


def snapshot(root: Path) -> dict[str, str]:
    """Every file and link under ``root``: path -> content hash (or link target)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("originals")
    return {"model": translation_dir(root / "model", eos_bias=4.0), "lm": lm_dir(root / "lm")}


@pytest.fixture
def ws(tmp_path, originals, monkeypatch) -> Path:
    """A workspace: a translation model, a language model, text files, a fake run, a corpus."""
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(originals["model"], tmp_path / "model")
    shutil.copytree(originals["lm"], tmp_path / "lm")
    (tmp_path / "in.txt").write_text("\n".join(DE) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(EN) + "\n", encoding="utf-8")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine, not aiayn's\n", encoding="utf-8")
    for step in (2, 4):  # a run with two checkpoints (a model directory + trainer state each)
        ckpt = tmp_path / "run" / f"step-{step:06d}"
        shutil.copytree(originals["model"], ckpt)
        (ckpt / "trainer_state.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "run" / "train_config.json").write_text("{}\n", encoding="utf-8")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid"):
        (corpus / f"{split}.de").write_text("\n".join(DE * 5) + "\n", encoding="utf-8")
        (corpus / f"{split}.en").write_text("\n".join(EN * 5) + "\n", encoding="utf-8")
    return tmp_path


def _edit_json(path: Path, **fields) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**data, **fields}), encoding="utf-8")


def _write(path: str, data: bytes) -> Callable[[Path], None]:
    return lambda ws: (ws / path).parent.mkdir(parents=True, exist_ok=True) or (ws / path).write_bytes(data)


def _truncate(path: str, keep: int) -> Callable[[Path], None]:
    return lambda ws: (ws / path).write_bytes((ws / path).read_bytes()[:keep])


def _other_shapes(ws: Path) -> None:
    translation_dir(ws / "other", eos_bias=4.0, d_ff=48)
    shutil.copy(ws / "other" / "model.safetensors", ws / "model" / "model.safetensors")
    shutil.rmtree(ws / "other")


def _blank_corpus(ws: Path) -> None:
    for side in ("de", "en"):
        (ws / "corpus" / f"train.{side}").write_text("\n\n\n", encoding="utf-8")


def _strip_trainer_state(ws: Path) -> None:
    """A run whose checkpoints were pruned to their models (to share them): still a run."""
    for ckpt in (ws / "run").glob("step-*"):
        (ckpt / "trainer_state.json").unlink()


def _project(ws: Path) -> None:
    """A user's folder that happens to hold a config.json: not a model directory."""
    (ws / "proj").mkdir()
    (ws / "proj" / "config.json").write_text("{}", encoding="utf-8")
    (ws / "proj" / "main.py").write_text("print('mine')\n", encoding="utf-8")


def _de_en(ws: Path) -> None:
    """The model's config.json records its languages, as a trained one's does."""
    meta = json.loads((ws / "model" / "config.json").read_text())
    (ws / "model" / "config.json").write_text(json.dumps({**meta, "src_lang": "de", "tgt_lang": "en"}))


TR = ["translate", "--model", "model", "--input", "in.txt"]
EV = ["evaluate", "--model", "model", "--src", "in.txt", "--ref", "ref.txt"]
TRAIN = ["train", "dataset=corpus", "out_dir=new_run", *TINY_TRAIN]
GEN = ["generate", "--model", "lm", "--prompt", "ab", "--max-new-tokens", "3"]

# (id, set-up of the workspace or None, argv, a fragment the one error line must contain)
CASES = [
    # -- would destroy data ------------------------------------------------------------------------
    (
        "export-into-itself",
        None,
        ["export", "--model", "model", "--to", "hf", "model"],
        "an input of this command",
    ),
    ("export-over-a-model", None, ["export", "--model", "model", "--to", "hf", "lm"], "pass --force"),
    (  # a project's config.json and src/ are a model's names, not a model: --force used to replace it
        "export-over-a-project-forced",
        lambda ws: [_write(f"proj/{name}", b'{"name": "x"}')(ws) for name in ("config.json", "src/main.c")],
        ["export", "--model", "model", "--to", "hf", "proj", "--force"],
        "holds no model",
    ),
    (
        "export-over-a-json-config-forced",
        _write("proj/config.json", b'{"name": "x"}'),
        ["export", "--model", "model", "--to", "hf", "proj", "--force"],
        "holds no model",
    ),
    (
        "export-over-a-run-forced",
        None,
        ["export", "--model", "model", "--to", "hf", "run", "--force"],
        "run is a training run: its checkpoints would be lost",
    ),
    ("plot-into-foreign-dir", None, ["plot", "run", "--out", "notes"], "files this command does not write"),
    (
        "export-into-foreign-dir",
        None,
        ["export", "--model", "model", "--to", "hf", "notes"],
        "holds no model",
    ),
    ("export-over-a-file", None, ["export", "--model", "model", "--to", "hf", "in.txt"], "is a file"),
    (
        "average-into-a-checkpoint",
        None,
        ["average", "run", "--last", "2", "--out", "run/step-000004"],
        "an input of this command",
    ),
    (
        "average-over-an-older-checkpoint-forced",
        None,
        ["average", "run", "--last", "1", "--out", "run/step-000002", "--force"],
        "is a checkpoint of the training run run: it would be lost",
    ),
    (
        "average-into-the-run",
        None,
        ["average", "run", "--last", "2", "--out", "run"],
        "an input of this command",
    ),
    (
        "average-over-averaged",
        _write("run/averaged/config.json", b'{"kind": "transformer", "config": {}}'),
        ["average", "run", "--last", "1"],
        "pass --force",
    ),
    ("translate-onto-its-input", None, [*TR, "--output", "in.txt"], "an input of this command"),
    (
        "translate-onto-a-symlinked-input",
        lambda ws: (ws / "link.txt").symlink_to(ws / "in.txt"),
        [*TR, "--output", "link.txt"],
        "an input of this command",
    ),
    ("translate-onto-the-model", None, [*TR, "--output", "model/config.json"], "an input of this command"),
    (
        "translate-into-a-missing-folder",
        None,
        [*TR, "--output", "nowhere/out.txt"],
        "folder nowhere does not exist",
    ),
    ("translate-onto-a-directory", None, [*TR, "--output", "notes"], "is a directory"),
    (
        "evaluate-two-outputs-one-file",
        None,
        [*EV, "--output", "h.txt", "--json", "h.txt"],
        "name the same file",
    ),
    ("evaluate-onto-the-reference", None, [*EV, "--output", "ref.txt"], "an input of this command"),
    ("demo-into-foreign-dir", None, ["demo", "--out", "notes", "--minutes", "1"], "holds no model"),
    ("demo-over-a-run", None, ["demo", "--out", "run", "--minutes", "1"], "pass --force"),
    (
        "train-into-foreign-dir",
        None,
        ["train", "dataset=corpus", "out_dir=notes", *TINY_TRAIN],
        "holds no run",
    ),
    ("train-into-a-file", None, ["train", "dataset=corpus", "out_dir=in.txt", *TINY_TRAIN], "is a file"),
    ("train-over-a-run", None, ["train", "dataset=corpus", "out_dir=run", *TINY_TRAIN], "--resume"),
    (
        "evaluate-onto-its-dataset",
        None,
        [*EV[:3], "--dataset", "corpus", "--split", "valid", "--output", "corpus/valid.en"],
        "an input of this command",
    ),
    (
        "train-over-checkpoints-without-state",
        _strip_trainer_state,
        ["train", "dataset=corpus", "out_dir=run", *TINY_TRAIN],
        "already holds a run",
    ),
    (
        "resume-checkpoints-without-state",
        _strip_trainer_state,
        ["train", "dataset=corpus", "out_dir=run", *TINY_TRAIN, "--resume"],
        "no trainer state",
    ),
    ("resume-a-missing-run", None, [*TRAIN, "--resume"], "cannot resume"),
    (
        "export-force-over-a-project",
        _project,
        ["export", "--model", "model", "--to", "hf", "proj", "--force"],
        "holds no model",
    ),
    (
        "export-into-a-symlink",
        lambda ws: (ws / "ln").symlink_to(ws / "lm"),
        ["export", "--model", "model", "--to", "hf", "ln", "--force"],
        "symbolic link",
    ),
    # -- tracebacks before --------------------------------------------------------------------------
    (
        "kind-not-a-string",
        lambda ws: _edit_json(ws / "model/config.json", kind=["transformer"]),
        TR,
        "'kind'",
    ),
    ("kind-a-number", lambda ws: _edit_json(ws / "model/config.json", kind=3), TR, "'kind'"),
    ("device-cuda-missing", None, [*TR, "--device", "cuda:99"], "device='cuda:99'"),  # a GPU machine too
    ("device-bogus", None, [*TR, "--device", "gpu0"], "device='gpu0'"),
    ("train-device-bogus", None, [*TRAIN, "device=tpu"], "device='tpu'"),
    # -- accepted before, refused now ---------------------------------------------------------------
    ("lenpen-nan", None, [*TR, "--lenpen", "nan"], "lenpen"),
    ("lenpen-inf", None, [*TR, "--lenpen", "inf"], "lenpen"),
    ("temperature-nan", None, [*TR, "--sample", "--temperature", "nan"], "temperature"),
    ("top-p-nan", None, [*TR, "--sample", "--top-p", "nan"], "top_p"),
    ("max-tokens-zero", None, [*TR, "--max-tokens", "0"], "max_tokens"),
    ("min-len-above-max-len", None, [*TR, "--min-len", "1000", "--max-len", "5"], "min_len"),
    ("max-src-len-zero", None, [*TR, "--max-src-len", "0"], "max_src_len"),
    ("max-src-len-negative", None, [*TR, "--max-src-len", "-4"], "max_src_len"),
    ("strict-long-line", None, [*TR, "--strict", "--max-src-len", "3"], "drop --strict to truncate it"),
    (
        "attention-long-src",
        None,
        ["attention", "--model", "model", "--src", "ein mann " * 3000, "--out", "maps"],
        "--src has 27001 tokens with </s>; this model reads at most 1024",
    ),
    (
        "attention-long-tgt",
        None,
        ["attention", "--model", "model", "--src", "ein mann", "--tgt", "a man " * 100, "--out", "maps"],
        "--tgt has 601 tokens with <s>; a map is drawn for at most 256",
    ),
    (
        "attention-lm-past-its-context",
        None,
        ["attention", "--model", "lm", "--src", "ab" * 200, "--out", "maps"],
        "--src has 400 tokens; a map is drawn for at most 256",
    ),
    ("lr-nan", None, [*TRAIN, "lr=nan"], "lr=nan"),
    (
        "lm-trained-max-len-negative",
        lambda ws: _edit_json(ws / "lm" / "config.json", trained_max_len=-5),
        GEN,
        "trained_max_len=-5 is not a positive number",
    ),
    (
        "lm-untrained-id-past-the-vocabulary",
        lambda ws: _edit_json(ws / "lm" / "config.json", untrained_ids=[999]),
        GEN,
        "untrained_ids are not ids of its",
    ),
    (
        "lm-max-len-past-memory",
        lambda ws: _edit_json(
            ws / "lm" / "config.json",
            config={
                **json.loads((ws / "lm" / "config.json").read_text(encoding="utf-8"))["config"],
                "max_len": 10**8,
            },
        ),
        GEN,
        "max_len=100000000 is over 131072 positions",
    ),
    ("threads-past-the-cpus", None, [*TRAIN, "threads=100000"], "threads=100000 is over"),
    ("max-minutes-past-overflow", None, [*TRAIN, "max_minutes=1e308"], "max_minutes=1e+308 is over"),
    (
        "max-tokens-too-few-for-a-sentence",
        None,
        [*TRAIN, "max_tokens=1"],
        "max_tokens=1 leaves no room for a sentence",
    ),
    (
        "serve-threads-past-the-cpus",
        None,
        ["serve", "--model", "model", "--threads", "100000"],
        "--threads 100000 must be in 0..",
    ),
    (
        "api-keys-a-directory",
        None,
        ["serve", "--model", "model", "--api-keys", "notes"],
        "notes is a directory, not a file",
    ),
    ("evaluate-src-and-dataset", None, [*EV, "--dataset", "nowhere"], "--dataset: not read for --src/--ref"),
    # the other direction's files (or BLEU's tokenizer for another language) were read without a word
    ("evaluate-other-direction", _de_en, [*EV, "--src-lang", "en"], "--src-lang en: model translates de→en"),
    ("evaluate-other-target", _de_en, [*EV, "--tgt-lang", "ja"], "--tgt-lang ja: model translates de→en"),
    (
        "plot-a-text-file",
        None,
        ["plot", "in.txt", "--out", "figs"],
        "give a run directory or its metrics.jsonl",
    ),
    ("lr-inf", None, [*TRAIN, "lr=inf"], "lr=inf"),
    ("max-minutes-negative", None, [*TRAIN, "max_minutes=-1"], "max_minutes"),
    ("clip-norm-negative", None, [*TRAIN, "clip_norm=-5"], "clip_norm"),
    ("min-lr-negative", None, [*TRAIN, "min_lr=-1"], "min_lr"),
    ("min-lr-above-lr", None, [*TRAIN, "schedule=cosine", "lr=0.001", "min_lr=0.01"], "min_lr"),
    ("beta2-one", None, [*TRAIN, "beta2=1.0"], "beta2"),
    ("label-smoothing-nan", None, [*TRAIN, "label_smoothing=nan"], "label_smoothing"),
    ("seed-past-int64", None, [*TR, "--sample", "--seed", "99999999999999999999"], "seed="),
    ("seed-below-int64", None, [*TR, "--sample", "--seed", "-99999999999999999999"], "is too small (int64"),
    ("max-steps-past-int64", None, [*TRAIN, "max_steps=99999999999999999999"], "max_steps="),
    ("demo-minutes-nan", None, ["demo", "--minutes", "nan", "--out", "new_demo"], "--minutes"),
    (
        "demo-beam-over-vocabulary",  # refused by the search, after the minutes of training
        None,
        ["demo", "--beam", "9000", "--out", "new_demo", "--minutes", "1"],
        "--beam 9000 exceeds the vocabulary the demo trains (8000 tokens)",
    ),
    ("generate-temperature-inf", None, ["generate", "--model", "lm", "--temperature", "inf"], "temperature"),
    ("seed-negative", None, [*TRAIN, "seed=-5"], "seed=-5"),
    ("model-max-len-past-int64", None, [*TRAIN, "model.max_len=99999999999999999999"], "max_len"),
    # -- messages that now name the file or field ----------------------------------------------------
    ("config-json-truncated", _truncate("model/config.json", 25), TR, "model/config.json"),
    (
        "config-of-the-wrong-shape",
        lambda ws: _edit_json(ws / "model/config.json", config="hello"),
        TR,
        "'config'",
    ),
    (
        "config-field-wrong-type",
        lambda ws: _edit_json(ws / "model/config.json", config={"d_model": "big"}),
        TR,
        "d_model",
    ),
    ("weights-truncated", _truncate("model/model.safetensors", 100), TR, "model.safetensors"),
    ("weights-of-another-shape", _other_shapes, TR, "ff"),
    (
        "weights-missing",
        lambda ws: (ws / "model/model.safetensors").unlink(),
        TR,
        "model.safetensors is missing",
    ),
    ("tokenizer-meta-truncated", _truncate("model/tokenizer.json", 10), TR, "tokenizer.json"),
    ("model-dir-missing", None, ["translate", "--model", "nope", "--input", "in.txt"], "nope"),
    ("lm-given-to-translate", None, ["translate", "--model", "lm", "--input", "in.txt"], "language model"),
    ("input-missing", None, ["translate", "--model", "model", "--input", "missing.txt"], "missing.txt"),
    (
        "input-not-utf8",
        _write("bad.txt", b"ok\n\xff\xfe\n"),
        ["translate", "--model", "model", "--input", "bad.txt"],
        "bad.txt: line 2",
    ),
    ("corpus-of-blank-lines", _blank_corpus, TRAIN, "train.de"),
    ("recipe-is-a-directory", None, ["train", "notes", "out_dir=new_run"], "is a directory"),
    ("recipe-missing", None, ["train", "nope.toml", "out_dir=new_run"], "nope.toml does not exist"),
    (
        "recipe-not-toml",
        _write("bad.toml", b"lr = = 3\n"),
        ["train", "bad.toml"],
        "bad.toml is not valid TOML",
    ),
    (
        "override-value-named",
        _write("r.toml", b"lr = 0.5\n"),
        ["train", "r.toml", "lr=fast"],
        "override 'lr=fast'",
    ),
    ("override-unknown-key", None, [*TRAIN, "lrr=1"], "override 'lrr=1'"),
    ("model-field-unknown", None, [*TRAIN, "model.d_modle=3"], "d_modle"),
    ("task-unknown", None, [*TRAIN, "task=mlm2"], "task='mlm2'"),
    ("average-last-zero", None, ["average", "run", "--last", "0"], "--last"),
    (
        "average-two-models",
        lambda ws: _edit_json(
            ws / "run/step-000004/config.json",
            config={**json.loads((ws / "run/step-000004/config.json").read_text())["config"], "d_ff": 48},
        ),
        ["average", "run", "--last", "2", "--out", "avg"],
        "different model configs",
    ),
    (
        "average-two-tokenizers",  # the average would read step 2's weights with step 4's pieces
        lambda ws: _edit_json(ws / "run/step-000002/tokenizer.json", note="another vocabulary"),
        ["average", "run", "--last", "2", "--out", "avg"],
        "run/step-000002 and run/step-000004 hold different tokenizer.json",
    ),
    (
        "average-truncated-weights",
        _truncate("run/step-000004/model.safetensors", 50),
        ["average", "run", "--last", "2", "--out", "avg"],
        "model.safetensors",
    ),
    (
        "lm-text-shorter-than-a-block",
        None,
        [
            "train",
            "task=lm",
            "tokenizer=char",
            "dataset=in.txt",
            "valid_dataset=ref.txt",
            "block_size=500",
            "out_dir=new_run",
            "progress=false",
        ],
        "block_size=500",
    ),
    (
        "resume-incompatible",
        None,
        ["train", "dataset=corpus", "out_dir=run", *TINY_TRAIN, "--resume"],
        "cannot",
    ),
]


def refused(root: Path, capsys, setup: Callable | None, argv: list[str]) -> tuple[list[str], str, dict, dict]:
    """Run ``argv`` in ``root`` after ``setup``; it must exit 1. Returns its stderr lines, its stdout and
    the snapshots of ``root`` before and after, for the caller's checks."""
    if setup is not None:
        setup(root)
    before = snapshot(root)
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 1, err
    return err, captured.out, before, snapshot(root)


@pytest.mark.parametrize(("setup", "argv", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_and_destroys_nothing(ws, capsys, setup, argv, fragment):
    err, _, before, after = refused(ws, capsys, setup, argv)
    last = err[-1] if err else ""
    assert last.startswith(f"aiayn {argv[0]}: error: "), err
    assert len([line for line in err if "error" in line]) == 1 and "Traceback" not in "\n".join(err), err
    assert fragment in last, last
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert not changed, f"files changed or removed: {changed}"


def test_force_replaces_a_model_only_when_asked(ws, capsys):
    """The refused cases above succeed with --force, and write whole directories."""
    assert main(["export", "--model", "model", "--to", "hf", "lm", "--force"]) == 0
    assert json.loads((ws / "lm" / "config.json").read_text())["model_type"] == "marian"
    assert not (ws / "lm" / "tokenizer.json").exists()  # replaced as a whole, nothing of the old left
    assert main(["average", "run", "--last", "2"]) == 0
    assert main(["average", "run", "--last", "2"]) == 1  # averaged/ now holds a model
    assert main(["average", "run", "--last", "2", "--force"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("argv", [["translate"], ["translate", "--model", "m", "--beam", "x"], ["transl"]])
def test_a_command_line_argparse_refuses_is_one_line_with_status_2(argv, capsys):
    """Before, argparse printed its usage and then the error: two lines."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("aiayn") and ": error: " in err[0] and "--help)" in err[0]


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["classify", "--model", "m", "--input", ""], "--input"),
        (["translate", "--model", ""], "--model"),
        (["export", "--model", "m", "--to", "hf", ""], "OUT"),
        (["average", "run", "--out", ""], "--out"),
        (["plot", ""], "run_dir"),
        (["evaluate", "--model", "m", "--json", ""], "--json"),
        (["evaluate", "--model", "m", "--dataset", ""], "--dataset"),
        (["serve", "--model", "a", "--model", ""], "--model"),
    ],
)
def test_an_empty_path_is_refused_by_name(argv, name, capsys):
    """Read as "." or as stdin before: ``--input "$UNSET"`` translated stdin, ``--out ''`` wrote into
    RUN/averaged, and the errors that came spoke of "."."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert f"aiayn {argv[0]}: error: {name}: the path is empty" in err[0]


def test_a_stray_word_is_refused_by_the_command_it_was_given_to(capsys):
    """argparse's top-level parser refused it, as if ``aiayn`` had been given it."""
    with pytest.raises(SystemExit) as exit_:
        main(["translate", "--model", "m", "stray"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert err == ["aiayn translate: error: unrecognized arguments: stray (see aiayn translate --help)"]


@pytest.mark.parametrize("argv", [["--bogus", "translate"], ["--bogus", "translate", "--model", "m"], ["-x"]])
def test_an_option_before_the_command_is_refused_by_aiayn(capsys, argv):
    """It was blamed on the command (``aiayn translate: … --model is required``, or its stray word)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert err == [f"aiayn: error: unrecognized arguments: {argv[0]} (see aiayn --help)"]
