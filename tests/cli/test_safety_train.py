"""More hostile cases (issue 57, the command line): each used to train or answer silently wrong, or
to end in a traceback. Each must now exit 1 with one line ``aiayn CMD: error: …`` that names the
field, file or argument, and leave every file of the workspace as it was (``test_safety``'s rule).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from aiayn import EncoderConfig, EncoderModel
from aiayn.cli.main import main
from aiayn.data import SentencePieceTokenizer
from aiayn.models.io import save_model
from tests.cli.test_safety import TINY_TRAIN, originals, refused, snapshot, ws  # noqa: F401 (fixtures)

TEXTS = ["a gorgeous , witty movie .", "one long string of cliches .", "the film is great", "a waste"] * 20
ENCODER = dict(d_model=32, n_heads=2, d_ff=64, n_layers=1, dropout=0.0)
TINY_CLASSIFY = ["task=classify", "vocab_size=300", "max_tokens=256", "model.d_model=16", "model.n_heads=2",
                 "model.d_ff=32", "model.n_layers=1", "progress=false", "threads=1"]  # fmt: skip


@pytest.fixture(scope="module")
def encoders(tmp_path_factory) -> dict[str, Path]:
    """An mlm model and a classifier as ``aiayn train`` saves them (``objective`` in config.json)."""
    root = tmp_path_factory.mktemp("encoders")
    tok = SentencePieceTokenizer.train(TEXTS, 300, mask=True)
    out = {}
    classifier = {"objective": "classify", "labels": ["neg", "pos"]}
    for name, n_classes, meta in (("mlm", 0, {"objective": "mlm"}), ("classifier", 2, classifier)):
        torch.manual_seed(0)
        model = EncoderModel(EncoderConfig(vocab_size=tok.vocab_size, n_classes=n_classes, **ENCODER))
        save_model(model, root / name, task=meta["objective"], **meta)
        tok.save(root / name)
        out[name] = root / name
    return out


@pytest.fixture
def ews(ws, encoders) -> Path:  # noqa: F811
    """``test_safety``'s workspace, with the encoders and a labelled table."""
    import shutil

    for name, path in encoders.items():
        shutil.copytree(path, ws / name)
    rows = ["sentence\tlabel"] + [f"{t}\t{'pos' if 'great' in t or 'witty' in t else 'neg'}" for t in TEXTS]
    (ws / "labelled").mkdir()
    for split in ("train", "valid"):
        (ws / "labelled" / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return ws


def _table(name: str, text: str) -> Callable[[Path], None]:
    return lambda root: (root / name).write_text(text, encoding="utf-8")


def _jsonl_labels(*labels: str) -> str:
    return "".join(
        json.dumps({"text": t, "label": labels[i % len(labels)]}) + "\n" for i, t in enumerate(TEXTS)
    )


def _csv_labels(*labels: str) -> str:
    rows = ["text,label"] + [f'"{t}","{labels[i % len(labels)]}"' for i, t in enumerate(TEXTS)]
    return "\n".join(rows) + "\n"


CLASSIFY = ["train", *TINY_CLASSIFY, "max_steps=2", "eval_every=2"]

# (id, set-up of the workspace or None, argv, fragments the one error line must contain)
CASES = [
    ("fill-mask-on-a-classifier", None, ["fill-mask", "--model", "classifier", "a <mask> film"],
     ["classifier", "'classify'", "task=mlm"]),
    ("label-with-a-newline", _table("nl.jsonl", _jsonl_labels("pos", "neg\nbad")),
     [*CLASSIFY, "dataset=nl.jsonl", "out_dir=new_run"], ["nl.jsonl:2", "'neg\\nbad'", "line break"]),
    ("label-with-a-tab", _table("tab.csv", _csv_labels("pos", "neg", "so\tso")),
     [*CLASSIFY, "dataset=tab.csv", "out_dir=new_run"], ["tab.csv:4", "'so\\tso'", "tab"]),
    ("vocab-size-huge", None, ["train", "dataset=corpus", "out_dir=new", *TINY_TRAIN, f"vocab_size={10**12}"],
     ["vocab_size=1000000000000", "too large"]),
    ("fill-mask-non-utf8", None, ["fill-mask", "--model", "mlm", os.fsdecode(b"a \xff <mask>")],
     ["argument 4", "b'a \\xff <mask>'", "UTF-8"]),
    ("attention-non-utf8", None, ["attention", "--model", "mlm", "--src", os.fsdecode(b"\xfe"), "--out", "o"],
     ["argument 5", "UTF-8"]),
]  # fmt: skip


@pytest.mark.parametrize(("setup", "argv", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_and_destroys_nothing(ews, capsys, setup, argv, fragments):
    err, out, before, after = refused(ews, capsys, setup, argv)
    assert len(err) == 1 and err[0].startswith(("aiayn: error: ", f"aiayn {argv[0]}: error: ")), err
    for fragment in fragments:
        assert fragment in err[0], err[0]
    assert out == ""  # no answer at all rather than a wrong one
    assert after == before


def test_tensorboard_without_the_package_says_how_to_install_it_before_writing(ews, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as where it is not installed
    before = snapshot(ews)
    argv = [*CLASSIFY, "dataset=labelled", "out_dir=new_run", "tensorboard=true"]  # a run that trains
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install tensorboard" in err[0], err
    assert snapshot(ews) == before and not (ews / "new_run").exists()


def test_a_non_utf8_argument_from_the_real_command_line_is_named(ews):
    """``argv`` as the OS gives it: bytes, which Python decodes with surrogateescape."""
    argv = [sys.executable, "-m", "aiayn", "fill-mask", "--model", "mlm", b"\xff <mask>"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(argv, cwd=ews, env=env, capture_output=True)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().splitlines() == [
        "aiayn: error: argument 4 (b'\\xff <mask>') is not valid UTF-8; pass text and paths as UTF-8"
    ]


def test_the_command_line_imports_torch_inside_main_so_ctrl_c_there_is_one_line(monkeypatch, capsys):
    # ``python -m aiayn``'s first import (the package, its entry point) must not import torch: an
    # import outside ``main`` ends in a traceback when the user presses Ctrl-C during it
    code = "import sys, aiayn.cli.main; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"

    def pressed(name):
        raise KeyboardInterrupt

    monkeypatch.setattr("aiayn.cli.main.import_module", pressed)  # Ctrl-C while a command imports
    assert main(["translate", "--help"]) == 130
    assert capsys.readouterr().err == "aiayn: interrupted\n"


def test_resume_after_a_new_label_names_the_label(ews, capsys):
    run = ["train", *TINY_CLASSIFY, "dataset=labelled", "out_dir=cls", "eval_every=2"]
    assert main([*run, "max_steps=2"]) == 0
    with open(ews / "labelled" / "train.tsv", "a", encoding="utf-8") as f:
        f.write("a so-so film\tneutral\n")
    capsys.readouterr()
    before = snapshot(ews)
    assert main([*run, "max_steps=2", "--resume"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("aiayn train: error: cannot resume"), err
    assert "labels: 'neutral' is new (the run was trained on 'neg', 'pos')" in err[0], err
    assert "restore the data" in err[0]
    assert snapshot(ews) == before
