"""``aiayn classify``, ``fill-mask``, ``evaluate --data`` and ``attention`` on encoder-only models,
and every bad input of the issue: one line naming the file, line or field; nothing changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from aiayn import EncoderConfig, EncoderModel
from aiayn.cli.main import main
from aiayn.data import SentencePieceTokenizer
from aiayn.decoding.classifier import ClassifierEnsemble, TextClassifier
from aiayn.models.io import save_model
from tests.cli.test_safety import snapshot
from tests.decoding.fixtures import lm_dir, translation_dir

TEXTS = ["a gorgeous , witty , seductive movie .", "one long string of cliches .", "the film is great",
         "the plot is dull and slow", "an absolute delight", "a waste of time"] * 20  # fmt: skip
SIZES = dict(d_model=32, n_heads=2, d_ff=64, n_layers=1, dropout=0.0)


def encoder_dir(path: Path, tok, n_classes: int, seed: int = 0, labels=("negative", "positive")) -> Path:
    torch.manual_seed(seed)
    model = EncoderModel(EncoderConfig(vocab_size=tok.vocab_size, n_classes=n_classes, **SIZES))
    extra = {"labels": list(labels)} if n_classes else {}
    save_model(model, path, **extra)
    tok.save(path)
    return path


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("encoders")
    tok = SentencePieceTokenizer.train(TEXTS, 300, mask=True)
    other = SentencePieceTokenizer.train(TEXTS, 320, mask=True)  # an ensemble's members may differ in it
    return {"classifier": encoder_dir(root / "classifier", tok, 2), "mlm": encoder_dir(root / "mlm", tok, 0),
            "translation": translation_dir(root / "translation"), "lm": lm_dir(root / "lm"),
            "classifier2": encoder_dir(root / "classifier2", other, 2, seed=1),
            "classifier3": encoder_dir(root / "classifier3", tok, 2, seed=2),  # classifier's vocabulary
            "other-labels": encoder_dir(root / "other-labels", tok, 2, labels=("bad", "good"))}  # fmt: skip


@pytest.fixture
def ws(tmp_path, originals, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))
    for name, path in originals.items():
        shutil.copytree(path, tmp_path / name)
    shutil.copytree(originals["classifier"], tmp_path / "bad-column")
    config = json.loads((tmp_path / "bad-column" / "config.json").read_text())
    (tmp_path / "bad-column" / "config.json").write_text(json.dumps({**config, "text_column": 1}))
    damaged = {"newline-labels": {"labels": ["a\nb", "c"]}, "twin-labels": {"labels": ["a", "a"]},
               "float-long-text": {"long_text": {"how": "head", "stride": 0, "max_len": 1e400}},
               "zero-long-text": {"long_text": {"how": "head", "stride": 0, "max_len": 0}}}  # fmt: skip
    for name, fields in damaged.items():  # config.json edited by hand: each was read as it came
        shutil.copytree(originals["classifier"], tmp_path / name)
        (tmp_path / name / "config.json").write_text(json.dumps({**config, **fields}))
    (tmp_path / "in.txt").write_text("a great movie\nawful\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nnice\tpositive\nbad\tnegative\n", encoding="utf-8")
    (tmp_path / "unseen.tsv").write_text("sentence\tlabel\nnice\tpositive\nmeh\tneutral\n", encoding="utf-8")
    (tmp_path / "short.tsv").write_text("sentence\tlabel\nnice\tpositive\nbad\n", encoding="utf-8")
    (tmp_path / "one.tsv").write_text("sentence\tlabel\n" + "nice\tpositive\n" * 30, encoding="utf-8")
    return tmp_path


def test_classify_lines_with_probabilities(ws, capsys):
    assert main(["classify", "--model", "classifier", "--input", "in.txt", "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line in lines:
        a, pa, b, pb = line.split("\t")
        assert {a, b} == {"negative", "positive"} and float(pa) >= float(pb)
        assert float(pa) + float(pb) == pytest.approx(1.0, abs=2e-4)
    assert main(["classify", "--model", "classifier", "--json", "--input", "in.txt"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and all(len(r["labels"]) == 1 for r in rows)
    # a blank line is no text: a blank line out (no label the model would give to nothing)
    Path("blank.txt").write_text(Path("in.txt").read_text().replace("\n", "\n\n  \n", 1), encoding="utf-8")
    assert main(["classify", "--model", "classifier", "--input", "blank.txt"]) == 0
    out = capsys.readouterr().out.split("\n")
    assert out[1:3] == ["", ""] and len(out) == 5 and all(out[i].count("\t") == 1 for i in (0, 3))
    assert main(["classify", "--model", "classifier", "--json", "--input", "blank.txt"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[1] == rows[2] == {"labels": [], "probabilities": []} and len(rows) == 4


def test_members_that_share_a_tokenizer_read_one_encoding_of_the_texts(ws, monkeypatch):
    """An ensemble tokenizes each batch once per distinct tokenizer (equal vocabulary files, not the
    same object: each member loads its own), and its probabilities stay the mean of the members'."""
    members = [TextClassifier.from_dir(ws / name) for name in ("classifier", "classifier3", "classifier2")]
    ensemble = ClassifierEnsemble(members)
    assert ensemble.reads_as == [0, 0, 2]
    texts = ["a great movie", "awful", "nice"]
    alone = torch.stack([m.probabilities(texts) for m in members]).mean(0)
    calls = []
    for k, m in enumerate(members):
        real = m.tokenizer.encode_batch
        monkeypatch.setattr(
            m.tokenizer, "encode_batch", lambda t, _k=k, _real=real: calls.append(_k) or _real(t)
        )
    assert torch.equal(ensemble.probabilities(texts), alone)
    assert calls == [0, 2]


def test_an_ensemble_of_classifiers_labels_with_the_mean_of_their_probabilities(ws, capsys):
    """``--ensemble-with``: each member reads the texts with its own tokenizer (two vocabularies
    here); the ensemble's probabilities are the mean of what each prints alone."""

    def probabilities(*models: str) -> list[dict[str, float]]:
        argv = ["classify", "--model", models[0], "--top-k", "2", "--json", "--input", "in.txt"]
        assert main(argv + (["--ensemble-with", *models[1:]] if models[1:] else [])) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        return [dict(zip(r["labels"], r["probabilities"], strict=True)) for r in rows]

    one, two, both = (
        probabilities("classifier"),
        probabilities("classifier2"),
        probabilities("classifier", "classifier2"),
    )
    assert one != two  # two different models
    for a, b, mean in zip(one, two, both, strict=True):
        assert mean == pytest.approx({y: (a[y] + b[y]) / 2 for y in a}, abs=2e-6)
    argv = ["classify", "--model", "classifier", "--ensemble-with", "classifier2", "--top-k", "2", "--json"]
    assert main([*argv, "--input", "in.txt", "--quantize", "bf16"]) == 0  # every member cast, none skipped
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for r, mean in zip(rows, both, strict=True):
        assert dict(zip(r["labels"], r["probabilities"], strict=True)) == pytest.approx(mean, abs=0.02)
    argv = ["evaluate", "--model", "classifier", "--ensemble-with", "classifier2", "--data", "dev.tsv"]
    assert main([*argv, "--json", "dev.json"]) == 0
    assert "dev.tsv: 2 examples, classifier + 1 more (an ensemble)" in capsys.readouterr().out
    assert json.loads((ws / "dev.json").read_text())["ensemble_with"] == ["classifier2"]


def test_evaluate_a_classifier_prints_accuracy_f1_and_confusion(ws, capsys):
    assert main(["evaluate", "--model", "classifier", "--data", "dev.tsv", "--json", "dev.json"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "macro-F1" in out and "confusion" in out
    report = json.loads((ws / "dev.json").read_text())
    assert report["examples"] == 2 and sum(map(sum, report["confusion"])) == 2


def test_evaluate_batches_a_classifier_as_classify_does_unless_told(ws, monkeypatch):
    from aiayn.decoding.classifier import DEFAULT_MAX_TOKENS, TextClassifier

    budgets = []
    score = TextClassifier.score
    monkeypatch.setattr(TextClassifier, "score", lambda self, data, max_tokens: budgets.append(max_tokens)
                        or score(self, data, max_tokens))  # fmt: skip
    assert main(["evaluate", "--model", "classifier", "--data", "dev.tsv"]) == 0
    assert main(["evaluate", "--model", "classifier", "--data", "dev.tsv", "--max-tokens", "5000"]) == 0
    assert budgets == [DEFAULT_MAX_TOKENS, 5000]  # classify's 8192, not translation's 4096


def test_fill_mask_and_encoder_attention(ws, capsys):
    assert main(["fill-mask", "--model", "mlm", "--top-k", "2", "a great <mask> ."]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.split("\t")[2].startswith("a great") for line in lines)
    assert main(["attention", "--model", "classifier", "--src", "a great movie", "--out", "plots"]) == 0
    assert (ws / "plots" / "encoder_layer0.png").is_file()


CASES = [
    (["classify", "--model", "translation"], "holds a translation model"),
    (["translate", "--model", "classifier"], "holds an encoder-only model (kind 'encoder'); this command"),
    (["average", "nonexistent", "--last", "2"], "nonexistent does not exist (or is not a directory)"),
    # two output lines for one input, an ambiguous label, an "inf"-token text
    (["classify", "--model", "newline-labels", "--input", "in.txt"], "labels=['a\\nb', 'c'] are not"),
    (["evaluate", "--model", "twin-labels", "--data", "dev.tsv"], "twin-labels: config.json: labels="),
    (["classify", "--model", "float-long-text", "--input", "in.txt"], "is not a policy (how, stride and an"),
    (["classify", "--model", "zero-long-text", "--input", "in.txt"], "(max_len=0 must be at least 3)"),
    (["classify", "--model", "mlm"], "has no classification head"),
    (["classify", "--model", "classifier", "--top-k", "0", "--input", "in.txt"], "top_k=0"),
    (["classify", "--model", "classifier", "--input", "in.txt", "--output", "in.txt"], "in.txt"),
    (["fill-mask", "--model", "mlm", "a great movie ."], "has no <mask>"),
    (["attention", "--model", "classifier", "--src", "   ", "--out", "maps"], "--src is blank; give some"),
    (["fill-mask", "--model", "translation", "a <mask> ."], "holds a translation model"),
    (["evaluate", "--model", "classifier", "--data", "unseen.tsv"], "unseen.tsv:3: label 'neutral'"),
    (["evaluate", "--model", "classifier", "--data", "short.tsv"], "short.tsv:3: 1 fields where line 1"),
    (["evaluate", "--model", "classifier"], "give the labelled file to score with --data"),
    (["evaluate", "--model", "bad-column", "--data", "dev.tsv"],
     "bad-column: its config.json's text_column=1 is not a column name or number in quotes"),
    (["plot", "runs/no-such-run"], "runs/no-such-run: no such file or directory"),
    (["evaluate", "--model", "translation", "--data", "dev.tsv"], "--data: not read for a translation model"),
    (["evaluate", "--model", "lm", "--data", "dev.tsv"], "holds a language model (kind 'lm'); this command"),
    # the other kind's options would be ignored: refused by name
    (["evaluate", "--model", "classifier", "--data", "dev.tsv", "--beam", "5", "--tokenized-bleu"],
     "--tokenized-bleu, --beam: not read for an encoder-only model"),
    (["evaluate", "--model", "classifier", "--data", "dev.tsv", "--ensemble-with", "other-labels"],
     "ensemble member 2 has the labels ['bad', 'good'] but member 1 has ['negative', 'positive']"),
    (["classify", "--model", "classifier", "--ensemble-with", "mlm", "--input", "in.txt"],
     "mlm: this encoder has no classification head"),  # which member (before: not said)
    (["evaluate", "--model", "translation", "--long-text", "windows"], "--long-text: not read for a transl"),
    (["train", "task=classify", "dataset=one.tsv", "out_dir=run", "progress=false"],
     "one.tsv: every example has the label 'positive'"),
    (["train", "task=classify", "dataset=short.tsv", "valid_dataset=dev.tsv", "out_dir=run"], "short.tsv:3:"),
    (["train", "task=classify", "dataset=dev.tsv", "valid_dataset=unseen.tsv", "out_dir=run"],
     "unseen.tsv:3: label 'neutral'"),
    (["train", "task=classify", "dataset=dev.tsv", "valid_dataset=dev.tsv", "init_from=translation",
      "out_dir=run"], "init_from='translation'"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "fragment"), CASES, ids=[f"{c[0][0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_and_changes_nothing(ws, capsys, argv, fragment):
    before = snapshot(ws)
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(f"aiayn {argv[0]}: error: ") and fragment in err[-1], err
    assert len([line for line in err if "error" in line]) == 1
    after = snapshot(ws)
    assert not [k for k in before if after.get(k) != before[k]], "files changed"
    assert not (ws / "run").exists() or not any((ws / "run").glob("step-*"))


def test_a_query_that_starts_with_a_mask_reads_as_training_masked_its_first_word(originals):
    """Training masks a text's first word as one id (its "▁film" piece); a query starting with
    <mask> must not put sentencepiece's lone "▁" piece before it, as a text in the middle does not."""
    from aiayn.decoding.classifier import MaskFiller

    filler = MaskFiller.from_dir(originals["mlm"])
    tok, mask = filler.tokenizer, filler.tokenizer.mask_id
    first, middle = filler.query_ids("<mask> great movie ."), filler.query_ids("a <mask> movie .")
    assert first == [mask, *tok.encode("great movie .")]  # the word after it keeps its own "▁"
    assert middle[: len(tok.encode("a")) + 1] == [*tok.encode("a"), mask]


def test_fill_mask_never_offers_a_byte_that_is_no_text_on_its_own(originals):
    """A byte-fallback piece of 0x80–0xFF is a part of some character's UTF-8 (and 0x00–0x1F a control
    byte): as a filler it reads "\ufffd". Made the model's favourite, it is passed over; a byte that is
    a character of its own (ASCII "A") stays a candidate."""
    from aiayn.decoding.classifier import MaskFiller

    filler = MaskFiller.from_dir(originals["mlm"])
    sp = filler.tokenizer.sp
    partial, ascii_a = sp.piece_to_id("<0xC3>"), sp.piece_to_id("<0x41>")
    assert sp.is_byte(partial) and sp.is_byte(ascii_a) and partial in filler.partial_bytes
    assert len(filler.partial_bytes) == 256 - 95  # every byte but the 95 printable ASCII characters
    real = filler.model.forward

    def favouring(ids):  # the partial byte first, "A" second, at every position
        logits = real(ids)
        logits[..., partial], logits[..., ascii_a] = 1e4, 1e3
        return logits

    filler.model.forward = favouring
    (fillers,) = filler.fill("the film is <mask>", top_k=3)
    assert [f.token for f in fillers][0] == "A" and all("\ufffd" not in f.token for f in fillers)
