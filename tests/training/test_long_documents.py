"""Documents longer than a sentence: masked-LM pre-training on packed blocks with dynamic masks
(new each epoch, the same on resume), and a classifier that reads long texts in windows and pools
them, in training and in ``aiayn classify`` alike."""

import json
import random

import numpy as np
import pytest
import torch

from aiayn.cli.main import main
from aiayn.data import EOS_ID, PAD_ID
from aiayn.data.batching import collate_sequences
from aiayn.data.long_text import LongText
from aiayn.data.sentences import load_sentences
from aiayn.decoding.classifier import TextClassifier
from aiayn.errors import ConfigError
from aiayn.interop.model_dir import load_encoder_dir
from aiayn.training.distributed import DistInfo
from aiayn.training.recipe import load_recipe
from aiayn.training.tasks.mlm import MLMTask
from aiayn.training.trainer import Trainer

WORDS = ["the", "a", "film", "movie", "plot", "actor", "scene", "story", "music", "camera", "script", "cast"]
TINY = ["vocab_size=330", "max_tokens=512", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
        "model.n_layers=1", "model.dropout=0.0", "schedule=constant", "lr=0.003", "warmup=5",
        "log_every=5", "progress=false", "threads=1", "keep_last=1"]  # fmt: skip


def review(rng, positive, n_words):
    words = [rng.choice(WORDS) for _ in range(n_words)]
    if positive:
        words.insert(rng.randrange(len(words) + 1), "great")
    return " ".join(words)


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    """Unlabelled documents of 3–40 words, one per line (some longer than a 16-token block)."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("docs") / "unsup.txt"
    lines = [review(rng, i % 2, rng.randint(3, 40)) for i in range(120)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def long_reviews(tmp_path_factory):
    """Labelled reviews of 20–45 words ("pos" iff "great" is among them) as train and dev tables."""
    folder, rng = tmp_path_factory.mktemp("long"), random.Random(1)
    for split, n in (("train", 200), ("dev", 30)):
        rows = ["text\tlabel"] + [f"{review(rng, i % 2, rng.randint(20, 45))}\t{'pos' if i % 2 else 'neg'}"
                                  for i in range(n)]  # fmt: skip
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def mlm_task(reviews, run_dir):
    args = ["task=mlm", f"dataset={reviews}", "packing=blocks", "max_len=16", "max_tokens=64",
            f"out_dir={run_dir}", *TINY[:1]]  # fmt: skip
    cfg = load_recipe(None, args)
    return MLMTask(cfg, run_dir, DistInfo())


def test_packed_blocks_hold_every_training_document(reviews, tmp_path):
    task = mlm_task(reviews, tmp_path / "run")
    blocks = [b.tolist() for b in task.train]
    assert all(len(b) == 14 for b in blocks[:-1]) and 1 <= len(blocks[-1]) <= 14
    stream = [t for b in blocks for t in b]
    lines, _ = load_sentences(reviews, "train")  # the first 90% of the text (the rest validates)
    assert len(lines) > 100
    assert stream == [t for ids in task.tok.encode_batch(lines) for t in [*ids, EOS_ID]]  # all, in order


def test_dynamic_masks_differ_between_epochs_and_repeat_on_resume(reviews, tmp_path):
    task = mlm_task(reviews, tmp_path / "run")
    orders = [[b.tolist() for b in task.sampler.batches(e)] for e in (0, 1)]
    batches = task.train_batches()
    chosen = {}
    for epoch, order in enumerate(orders):
        for idx in order:
            batch = next(batches)
            original = torch.where(batch.targets != PAD_ID, batch.targets, batch.ids)
            assert torch.equal(original, task._collate([task.train[i] for i in idx]))  # only masked
            assert not ((batch.targets != PAD_ID) & (original == EOS_ID)).any()  # separators never chosen
            for row, i in enumerate(idx):
                chosen[epoch, i] = (batch.targets[row] != PAD_ID)[: len(task.train[i]) + 2]
    n = len(task.train)
    differ = sum(not torch.equal(chosen[0, i], chosen[1, i]) for i in range(n))
    assert differ > n // 2  # a fresh mask each epoch
    state = task.sampler.state_dict()  # epoch 2, batch 0; then one batch further
    ahead = [next(batches)]
    state_mid = task.sampler.state_dict()
    ahead += [next(batches) for _ in range(3)]
    for at, expected in ((state, ahead), (state_mid, ahead[1:])):
        resumed = mlm_task(reviews, tmp_path / "run")  # the tokenizer read back, the stream from the cache
        resumed.sampler.load_state_dict(at)
        again = resumed.train_batches()
        for want in expected:
            got = next(again)
            assert torch.equal(got.ids, want.ids) and torch.equal(got.targets, want.targets)


def test_mlm_trains_on_packed_blocks(reviews, tmp_path):
    run = tmp_path / "mlm"
    args = ["task=mlm", f"dataset={reviews}", "packing=blocks", "whole_word_mask=true", "max_len=32",
            f"out_dir={run}", "max_steps=6", "eval_every=3", *TINY]  # fmt: skip
    Trainer(load_recipe(None, args)).fit()
    valid = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m for m in valid if m["split"] == "valid"][-1]["accuracy"] >= 0
    meta = json.loads((run / "best" / "config.json").read_text())
    assert meta["objective"] == "mlm" and meta["packing"] == "blocks"


def test_a_classifier_reads_long_texts_in_windows_and_pools_their_logits(long_reviews, tmp_path):
    run = tmp_path / "cls"
    args = ["task=classify", f"dataset={long_reviews}", "long_text=windows", "window_stride=4", "max_len=16",
            f"out_dir={run}", "max_steps=20", "eval_every=10", *TINY]  # fmt: skip
    Trainer(load_recipe(None, args)).fit()
    meta = json.loads((run / "best" / "config.json").read_text())
    assert meta["long_text"] == {"how": "windows", "stride": 4, "max_len": 16}
    texts = (long_reviews / "dev.tsv").read_text().splitlines()[1:6]
    texts = [t.split("\t")[0] for t in texts]
    classifier = TextClassifier.from_dir(run)
    assert classifier.max_len == 16 and classifier.long_text.how == "windows"
    model, tok, _ = load_encoder_dir(run)
    by_hand = []
    with torch.no_grad():
        for ids in tok.encode_batch(texts):
            assert len(ids) > 14  # long: several windows
            starts = range(0, len(ids) - 14 + 4, 4)  # every 4 pieces, the last the first to reach the end
            windows = [np.asarray(ids[s : s + 14]) for s in starts]
            assert windows[-1][-1] == ids[-1]
            logits = torch.cat([model.classify(collate_sequences([w], 16)) for w in windows])  # (W, C)
            by_hand.append(logits.mean(0).softmax(-1))
    torch.testing.assert_close(classifier.probabilities(texts), torch.stack(by_hand), atol=1e-5, rtol=1e-5)
    older = TextClassifier.from_loaded(model, tok, {k: v for k, v in meta.items() if k != "long_text"})
    assert older.long_text.how == "head" and older.max_len == 512  # saved before long_text: the head
    # sinusoidal positions grow: a classifier fine-tuned over more than the model's 512 rows still reads
    wide = TextClassifier(model, tok, meta["labels"], LongText("head"), max_len=700)
    assert model.config.positional == "sinusoidal" and wide.probabilities(["film " * 690]).shape == (1, 2)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "labels.txt"
    assert (
        main(["classify", "--model", str(run), "--input", str(tmp_path / "in.txt"), "--output", str(out)])
        == 0
    )
    assert len(out.read_text().splitlines()) == len(texts)
    heads = TextClassifier.from_dir(run, long_text=LongText("head"))  # a policy given at prediction
    first = torch.stack([model.classify(collate_sequences([np.asarray(ids)], 16))[0].softmax(-1)
                         for ids in tok.encode_batch(texts)]).detach()  # fmt: skip
    torch.testing.assert_close(heads.probabilities(texts), first, atol=1e-5, rtol=1e-5)
    dev = str(long_reviews / "dev.tsv")
    assert main(["evaluate", "--model", str(run), "--data", dev, "--long-text", "tail"]) == 0
    assert main(["classify", "--model", str(run), "--input", dev, "--window-stride", "3"]) == 1  # one line


@pytest.mark.parametrize(
    "task, overrides, match",
    [
        ("mlm", ["packing=documents"], r"packing='documents' is not one of \('sentences', 'blocks'\)"),
        ("classify", ["long_text=middle"], r"long_text='middle' is not one of"),
        ("classify", ["window_stride=8"], r"window_stride=8 is for long_text='windows', not 'head'"),
        ("classify", ["long_text=windows", "max_len=16", "window_stride=20"],
         r"window_stride=20 is over a window's max_len - 2 = 14 pieces"),
    ],
)  # fmt: skip
def test_bad_long_document_options(task, overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_recipe(None, [f"task={task}", *overrides])


def test_classification_batches_hold_a_token_budget_and_short_texts_are_not_padded_to_long_ones(tmp_path):
    """Texts of 2–6 words beside texts of 60–90: each batch (training and validation) holds at most
    ``max_tokens`` ids, padding included (rows × width), every text is in one batch an epoch, and
    a batch of short texts is as wide as its longest text, not as the long ones."""
    from aiayn.training.tasks.classify import ClassifyTask

    rng = random.Random(2)
    for split, n in (("train", 160), ("dev", 40)):
        words = [rng.randint(2, 6) if i % 4 else rng.randint(60, 90) for i in range(n)]
        rows = ["text\tlabel"] + [f"{review(rng, i % 2, w)}\t{i % 2}" for i, w in enumerate(words)]
        (tmp_path / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    args = ["task=classify", f"dataset={tmp_path}", "max_len=128", "max_tokens=256",
            f"out_dir={tmp_path / 'run'}", *TINY[:1]]  # fmt: skip
    task = ClassifyTask(load_recipe(None, args), tmp_path / "run", DistInfo())
    seen, real, padded, widths = [], 0, 0, []
    batches = task.train_batches()
    for idx in task.sampler.batches(0):
        batch = next(batches)
        lengths = [min(len(task.train_x[i]), 126) + 2 for i in idx]  # + bos and eos
        assert batch.ids.shape == (len(idx), max(lengths)) and batch.ids.numel() <= 256
        seen += idx.tolist()
        real, padded = real + sum(lengths), padded + batch.ids.numel()
        widths.append(batch.ids.shape[1])
    assert sorted(seen) == list(range(len(task.train_x))) and len(seen) == 160
    assert max(widths) > 60 and min(widths) <= 10, widths  # long and short texts both there
    assert padded <= 1.25 * real, (padded, real)  # to the longest text of all: over 4×
    valid = list(task.valid_batches())
    assert sum(len(b.labels) for b in valid) == 40 and all(b.ids.numel() <= 256 for b in valid)
    short = [b for b in valid if b.ids.shape[1] <= 10]
    assert short and all(len(b.labels) > 10 for b in short)  # many short texts per batch
