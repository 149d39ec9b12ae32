"""A classifier's regularisers: word dropout (``word_dropout``: training texts lose pieces, validation
keeps all), R-Drop (``r_drop``: two dropout passes and their symmetric KL) and mixup of pooled
vectors (``mixup``), adversarial training on the embedded input (``adversarial``) and random
re-segmentation of the training texts (``subword_dropout``)."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from aiayn import EncoderConfig, EncoderModel
from aiayn.data.batching import ClassifyBatch
from aiayn.data.subword import SAMPLES_DIR, report, to_ragged
from aiayn.errors import ConfigError
from aiayn.training import criteria
from aiayn.training.recipe import load_recipe
from aiayn.training.tasks.classify import drop_words
from aiayn.training.trainer import Trainer
from tests.helpers import assert_close
from tests.training.test_encoder_tasks import TINY, rule_data  # noqa: F401 (a fixture)


def test_drop_words_keeps_an_ordered_share_and_at_least_one_piece():
    row = np.arange(100_000, dtype=np.int32)
    kept = drop_words(row, 0.25, np.random.default_rng(7))
    assert np.all(np.diff(kept) > 0)  # a subsequence, in order
    assert len(kept) / len(row) == pytest.approx(0.75, abs=0.01)
    expected = row[np.random.default_rng(7).random(len(row)) >= 0.25]  # the same draws, kept where ≥ p
    assert np.array_equal(kept, expected)
    rng = np.random.default_rng(0)
    assert all(len(drop_words(np.array([5, 6], np.int32), 0.99, rng)) >= 1 for _ in range(200))
    assert len(drop_words(np.array([], np.int32), 0.5, rng)) == 0


def _pieces(batch, pad):
    """Each row's pieces between bos and eos."""
    return [[i for i in row.tolist() if i != pad][1:-1] for row in batch.ids]


def _is_subsequence(short, long):
    it = iter(long)
    return all(any(x == y for y in it) for x in short)


def test_training_batches_leave_pieces_out_and_validation_reads_every_piece(rule_data, tmp_path):  # noqa: F811
    tasks = {}
    for p in (0.0, 0.4):
        args = ["task=classify", f"dataset={rule_data}", f"out_dir={tmp_path / str(p)}", f"word_dropout={p}"]
        tasks[p] = Trainer(load_recipe(None, [*args, *TINY])).task
    pad = tasks[0.0].special_ids["pad_id"]
    plain, dropped = tasks[0.0].train_batches(), tasks[0.4].train_batches()
    kept = total = 0
    for _ in range(5):
        a, b = next(plain), next(dropped)
        assert b.labels.tolist() == a.labels.tolist()  # the same texts in the same order
        for short, long in zip(_pieces(b, pad), _pieces(a, pad), strict=True):
            assert 1 <= len(short) <= len(long) and _is_subsequence(short, long)
            kept, total = kept + len(short), total + len(long)
    assert 0.5 < kept / total < 0.7  # 60% kept in expectation
    for a, b in zip(tasks[0.0].valid_batches(), tasks[0.4].valid_batches(), strict=True):
        assert a.ids.equal(b.ids) and a.labels.equal(b.labels)


def test_subword_dropout_trains_on_saved_resegmentations_of_the_same_texts(rule_data, tmp_path, capsys):  # noqa: F811
    """Each epoch reads one of the run's saved samples (epoch mod their number): every row spells
    the same text as the deterministic one, in other pieces; validation reads the deterministic ones."""
    args = ["task=classify", f"dataset={rule_data}", *TINY]
    plain = Trainer(load_recipe(None, [*args, f"out_dir={tmp_path / 'plain'}"])).task
    task = Trainer(load_recipe(None, [*args, f"out_dir={tmp_path / 'bpe'}", "subword_dropout=0.3"])).task
    # said once: the samples against the deterministic segmentation of the same texts, text by text
    said = report(
        0.3, "texts", {"": (to_ragged(task.tok.encode_batch(task.train.texts)), task.samples)}, True
    )
    assert f"aiayn train: {said}\n" in capsys.readouterr().err and "% of texts split otherwise" in said
    files = sorted(p.name for p in (tmp_path / "bpe" / SAMPLES_DIR).iterdir())
    assert files == [f"texts-{k}.npz" for k in range(8)] and len(task.samples) == 8
    tok, differ = task.tok, 0
    for sample in task.samples:
        for i, row in enumerate(plain.train_x):
            assert tok.decode(sample[i]) == tok.decode(row)  # the same text
            differ += not np.array_equal(sample[i], row)
    assert differ > len(plain.train_x)  # other pieces, in many rows of the 8 samples
    pad = task.special_ids["pad_id"]
    rows = _pieces(next(task.train_batches()), pad)
    sampled = {
        tuple(r.tolist())
        for r in (task.samples[task.sampler.epoch % 8][i] for i in range(len(plain.train_x)))
    }
    deterministic = {tuple(r.tolist()) for r in plain.train_x}
    assert all(tuple(r) in sampled for r in rows) and any(tuple(r) not in deterministic for r in rows)
    for a, b in zip(plain.valid_batches(), task.valid_batches(), strict=True):
        assert a.ids.equal(b.ids) and a.labels.equal(b.labels)


def test_r_drop_is_two_dropout_passes_cross_entropy_and_their_symmetric_kl():
    """Against ``F.cross_entropy`` and ``F.kl_div`` on the same two passes (the same dropout masks,
    drawn from the same seed): L = (CE_a + CE_b) / 2 + α/4 · (KL(a‖b) + KL(b‖a)), summed over the batch."""
    torch.manual_seed(0)
    config = EncoderConfig(
        vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=1, n_classes=3, dropout=0.3
    )
    model = EncoderModel(config).train()
    ids = torch.randint(4, 40, (5, 7))
    ids[1, 5:], ids[3, 4:] = 0, 0
    batch, alpha, eps = ClassifyBatch(ids, torch.tensor([0, 2, 1, 1, 0])), 2.0, 0.1
    torch.manual_seed(1)
    loss, nll, n = criteria.classification_r_drop_loss(model, batch, eps, alpha)
    torch.manual_seed(1)
    a, b = model.classify(ids.repeat(2, 1)).chunk(2)
    assert not torch.allclose(a, b)  # two dropout masks
    ce = lambda x, s: F.cross_entropy(x, batch.labels, reduction="sum", label_smoothing=s)  # noqa: E731
    la, lb = F.log_softmax(a, -1), F.log_softmax(b, -1)
    kl = F.kl_div(lb, la, log_target=True, reduction="sum") + F.kl_div(
        la, lb, log_target=True, reduction="sum"
    )
    assert_close("R-Drop loss", loss, (ce(a, eps) + ce(b, eps)) / 2 + alpha / 4 * kl, atol=1e-5)
    assert_close("R-Drop NLL", nll, (ce(a, 0.0) + ce(b, 0.0)) / 2, atol=1e-5)
    assert int(n) == 5


def test_mixup_mixes_pooled_vectors_and_both_labels_by_one_lambda():
    """Against the formula with λ and π drawn from the same seed (dropout off, so the draws are the
    only randomness): logits = classifier(λ·h + (1 − λ)·h[π]), L = λ·CE(y) + (1 − λ)·CE(y[π])."""
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=1, n_classes=3)
    model = EncoderModel(config).eval()
    ids = torch.randint(4, 40, (6, 7))
    ids[1, 5:], ids[3, 4:] = 0, 0
    batch, eps = ClassifyBatch(ids, torch.tensor([0, 2, 1, 1, 0, 2])), 0.1
    torch.manual_seed(3)
    loss, nll, n = criteria.classification_mixup_loss(model, batch, eps, 0.4)
    torch.manual_seed(3)
    lam = float(torch.distributions.Beta(0.4, 0.4).sample())
    perm = torch.randperm(6)
    assert 0 < lam < 1 and not torch.equal(perm, torch.arange(6))
    with torch.no_grad():
        h = model.pool(ids, model.encode(ids)[0])
        logits = model.classifier.out(lam * h + (1 - lam) * h[perm])
    ce = lambda y, s: F.cross_entropy(logits, y, reduction="sum", label_smoothing=s)  # noqa: E731
    y, yp = batch.labels, batch.labels[perm]
    assert_close("mixup loss", loss, lam * ce(y, eps) + (1 - lam) * ce(yp, eps))
    assert_close("mixup NLL", nll, lam * ce(y, 0.0) + (1 - lam) * ce(yp, 0.0))
    assert int(n) == 6


def test_adversarial_loss_adds_the_loss_one_normalised_gradient_step_away_for_each_text():
    """Against each text's own gradient, computed alone (dropout off, so a text's loss depends on it
    only): the added term is Σ_i CE(x_i + r·g_i/‖g_i‖), and to first order it exceeds the clean loss
    by r·Σ_i ‖g_i‖ (a sign error, or one norm for the whole batch, fails both)."""
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=2, n_classes=3)
    model = EncoderModel(config).eval()
    ids = torch.randint(4, 40, (5, 7))
    ids[1, 5:], ids[3, 4:] = 0, 0
    labels, eps = torch.tensor([0, 2, 1, 1, 0]), 0.1
    weight = torch.tensor([1.0, 2.0, 0.5])

    def ce(logits, y):  # each text's smoothed loss, weighed by its own class
        return (weight[y] * F.cross_entropy(logits, y, reduction="none", label_smoothing=eps)).sum()

    clean = steps = 0.0
    for radius in (0.5, 1e-3):
        loss, nll, n = criteria.classification_adversarial_loss(
            model, ClassifyBatch(ids, labels), eps, radius, weight
        )
        expected, clean, steps = torch.zeros(()), torch.zeros(()), torch.zeros(())
        for i in range(5):
            x = model.embed(ids[i : i + 1]).detach().requires_grad_()
            li = ce(model.classify(ids[i : i + 1], embedded=x), labels[i : i + 1])
            (g,) = torch.autograd.grad(li, x)
            adv = ce(model.classify(ids[i : i + 1], embedded=x + radius * g / g.norm()), labels[i : i + 1])
            expected, clean, steps = expected + li + adv, clean + li, steps + g.norm()
        assert_close(f"adversarial loss (r={radius})", loss, expected, atol=1e-5)
        assert_close(
            "NLL (the clean pass's)", nll, F.cross_entropy(model.classify(ids), labels, reduction="sum")
        )
        assert int(n) == 5
    assert float((loss - 2 * clean).detach()) == pytest.approx(1e-3 * float(steps), rel=0.02)  # 1st order


def test_adversarial_loss_trains_the_embeddings_through_both_passes():
    """At radius 0 the gradient is twice the plain loss's; at radius > 0 the perturbed pass adds its own."""
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=1, n_classes=2)
    model = EncoderModel(config).eval()
    batch = ClassifyBatch(torch.randint(4, 40, (4, 6)), torch.tensor([0, 1, 1, 0]))
    weight = model.embed.tokens.embedding.weight

    def grad(loss):
        model.zero_grad()
        loss.backward()
        return weight.grad.clone()

    plain = grad(criteria.classification_loss(model, batch, 0.0).loss)
    assert_close(
        "radius 0", grad(criteria.classification_adversarial_loss(model, batch, 0.0, 0.0).loss), 2 * plain
    )
    perturbed = grad(criteria.classification_adversarial_loss(model, batch, 0.0, 2.0).loss)
    assert not torch.allclose(perturbed, 2 * plain, atol=1e-4)


@pytest.mark.parametrize(
    "extra", [["r_drop=1.0"], ["mixup=0.4"], ["adversarial=1.0"], ["subword_dropout=0.3"]]
)
def test_r_drop_and_mixup_runs_resume_exactly_and_evaluate_plainly(rule_data, tmp_path, extra):  # noqa: F811
    args = ["task=classify", f"dataset={rule_data}", *extra, "eval_every=5", *TINY, "model.dropout=0.3"]
    args.append("label_smoothing=0")  # the loss is the NLL (but for R-Drop's KL term)
    Trainer(load_recipe(None, [*args, f"out_dir={tmp_path / 'ref'}", "max_steps=10"])).fit()
    Trainer(load_recipe(None, [*args, f"out_dir={tmp_path / 'run'}", "max_steps=5"])).fit()
    Trainer(load_recipe(None, [*args, f"out_dir={tmp_path / 'run'}", "max_steps=10"]), resume=True).fit()
    ref, run = ([r for r in _records(tmp_path / d) if r["split"] == "train"] for d in ("ref", "run"))
    assert [r["step"] for r in run] == [r["step"] for r in ref]
    assert [r["loss"] for r in run] == pytest.approx([r["loss"] for r in ref], rel=1e-5)
    if extra == ["r_drop=1.0"]:
        assert all(r["loss"] > r["nll"] for r in ref)  # the KL term, on top of the passes' mean NLL
    valid = [r for r in _records(tmp_path / "ref") if r["split"] == "valid"]
    assert all(r["loss"] == pytest.approx(r["nll"]) for r in valid)  # no KL term, no smoothing


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("r_drop=-1", r"r_drop=-1.0 must be ≥ 0"),
        ("r_drop=1 class_weights=balanced", r"r_drop=1.0 does not weigh"),
        ("mixup=-1", r"mixup=-1.0 must be ≥ 0"),
        ("mixup=0.4 r_drop=1", r"mixup=0.4 and r_drop are two training losses"),
        ("adversarial=-1", r"adversarial=-1.0 must be ≥ 0"),
        ("adversarial=1 mixup=0.4", r"adversarial=1.0 and mixup are two training losses"),
        ("subword_dropout=1", r"subword_dropout=1.0 must be in \[0, 1\)"),
        ("subword_dropout=0.1 long_text=windows", r"subword_dropout=0.1 re-segments whole texts"),
    ],
)
def test_classify_r_drop_is_validated(override, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(None, ["task=classify", *override.split()])


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
