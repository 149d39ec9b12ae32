"""The encoder-only tasks through the real trainer: masked-LM pre-training, a classifier that
learns a synthetic rule to 100%, fine-tuning that starts from exactly the pre-trained encoder."""

import json
import random
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aiayn import EncoderConfig, EncoderModel
from aiayn.cli.main import main
from aiayn.decoding.classifier import MaskFiller
from aiayn.errors import ConfigError, DataError, ModelDirError
from aiayn.interop.model_dir import load_encoder_tokenizer
from aiayn.models.io import load_model, save_model
from aiayn.serve.services import EncoderService
from aiayn.training.recipe import load_recipe
from aiayn.training.trainer import Trainer

WORDS = [
    "the",
    "a",
    "film",
    "movie",
    "plot",
    "actor",
    "scene",
    "story",
    "music",
    "camera",
    "script",
    "ending",
    "cast",
]
TINY = ["vocab_size=330", "max_tokens=512", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
        "model.n_layers=1", "model.dropout=0.0", "schedule=constant", "lr=0.003", "warmup=5",
        "log_every=5", "progress=false", "threads=1", "keep_last=1"]  # fmt: skip


@pytest.fixture(scope="module")
def rule_data(tmp_path_factory):
    """Label "pos" iff the text holds "great" (among 2–8 filler words); train and dev tables."""
    folder = tmp_path_factory.mktemp("rule")
    rng = random.Random(0)
    for split, n in (("train", 600), ("dev", 80)):
        rows = ["sentence\tlabel"]
        for i in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.randint(2, 8))]
            if i % 2:
                words.insert(rng.randrange(len(words) + 1), "great")
            rows.append(f"{' '.join(words)}\t{'pos' if i % 2 else 'neg'}")
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def train(args, resume=False):
    if any(a.startswith("init_from=") and a != "init_from=" for a in args):  # its tokenizer, its size
        args = [a for a in args if not a.startswith("vocab_size=")]
    return Trainer(load_recipe(None, args), resume=resume).fit()


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_classifier_learns_a_rule_to_100_percent(rule_data, tmp_path):
    run = tmp_path / "cls"
    train(["task=classify", f"dataset={rule_data}", f"out_dir={run}", "max_steps=150", "eval_every=50", *TINY,
           "keep_last=3"])  # fmt: skip
    valid = [m for m in metrics(run) if m["split"] == "valid"]
    assert valid[-1]["accuracy"] == 100.0 and valid[-1]["macro_f1"] == 100.0
    meta = json.loads((run / "best" / "config.json").read_text())
    assert meta["labels"] == ["neg", "pos"] and meta["config"]["n_classes"] == 2
    out = tmp_path / "labels.txt"
    dev = rule_data / "dev.tsv"
    (tmp_path / "in.txt").write_text("the great film\nthe film\n", encoding="utf-8")
    assert (
        main(["classify", "--model", str(run), "--input", str(tmp_path / "in.txt"), "--output", str(out)])
        == 0
    )
    assert [line.split("\t")[0] for line in out.read_text().splitlines()] == ["pos", "neg"]
    assert (
        main(["evaluate", "--model", str(run), "--data", str(dev), "--json", str(tmp_path / "e.json")]) == 0
    )
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["accuracy"] == 100.0 and report["confusion"] == [[40, 0], [0, 40]]
    # an average of its checkpoints is a classifier too: the labels and the long-text policy come along
    assert main(["average", str(run), "--last", "3"]) == 0
    averaged = json.loads((run / "averaged" / "config.json").read_text())
    newest = json.loads((run / "step-000150" / "config.json").read_text())
    assert {k: v for k, v in averaged.items() if k != "averaged"} == newest and len(averaged["averaged"]) == 3
    assert main(["evaluate", "--model", str(run / "averaged"), "--data", str(dev)]) == 0


@pytest.fixture(scope="module")
def mlm_run(rule_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("mlm") / "run"
    data = rule_data / "train.tsv"
    train(["task=mlm", f"dataset={data}", f"out_dir={run}", "max_steps=60", "eval_every=30",
           "whole_word_mask=true", *TINY])  # fmt: skip
    return run


def test_mlm_learns_and_fills_masks(mlm_run, capsys):
    valid = [m for m in metrics(mlm_run) if m["split"] == "valid"]
    assert valid[-1]["accuracy"] > valid[0]["accuracy"] - 1e-9 and valid[-1]["accuracy"] > 10
    meta = json.loads((mlm_run / "best" / "config.json").read_text())
    assert meta["kind"] == "encoder" and meta["objective"] == "mlm"
    assert meta["trained_max_len"] == json.loads((mlm_run / "train_config.json").read_text())["max_len"]
    assert main(["fill-mask", "--model", str(mlm_run), "--top-k", "3", "--json", "the <mask> film"]) == 0
    fillers = json.loads(capsys.readouterr().out)
    assert len(fillers) == 1 and len(fillers[0]) == 3
    assert all(f["sequence"].startswith("the") and f["sequence"].endswith("film") for f in fillers[0])
    assert EncoderService("mlm", mlm_run).filler is not None
    assert fillers[0][0]["probability"] >= fillers[0][1]["probability"]


def test_init_from_loads_exactly_the_pretrained_encoder(mlm_run, rule_data, tmp_path):
    run = tmp_path / "ft"
    train(["task=classify", f"dataset={rule_data}", f"out_dir={run}", f"init_from={mlm_run}", "max_steps=1",
           "eval_every=1", *TINY, "lr=1e-12"])  # fmt: skip
    pre = load_file(mlm_run / "best" / "model.safetensors")
    tuned = load_model(run / "step-000001").state_dict()
    shared = [k for k in pre if not k.startswith("classifier.")]
    assert shared and all(torch.allclose(tuned[k], pre[k], atol=1e-9) for k in shared)
    assert {k for k in tuned if k.startswith("classifier.")}  # a new head
    assert (run / "step-000001" / "spm.model").read_bytes() == (mlm_run / "best" / "spm.model").read_bytes()


def test_a_fine_tuning_run_resumes_exactly_after_its_init_from_is_gone(mlm_run, rule_data, tmp_path, capsys):
    """The run keeps the tokenizer's copy and its checkpoints hold every weight: a resume needs neither."""
    pre = tmp_path / "pre"
    shutil.copytree(mlm_run, pre, symlinks=True)
    base = ["task=classify", f"dataset={rule_data}", f"init_from={pre}", "eval_every=4", *TINY]
    straight, split = tmp_path / "straight", tmp_path / "split"
    train([*base, f"out_dir={straight}", "max_steps=8"])
    train([*base, f"out_dir={split}", "max_steps=4"])
    shutil.rmtree(pre)
    train([*base, f"out_dir={split}", "max_steps=8"], resume=True)
    assert "no longer loads" in capsys.readouterr().err
    a, b = load_model(straight / "step-000008").state_dict(), load_model(split / "step-000008").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ModelDirError, match=r"init_from="):  # a new run still needs it
        train([*base, f"out_dir={tmp_path / 'new'}", "max_steps=1"])


def test_init_from_refuses_other_sizes_and_other_kinds(mlm_run, rule_data, tmp_path):
    args = ["task=classify", f"dataset={rule_data}", "max_steps=1", *TINY]
    with pytest.raises(ConfigError, match=r"model.d_model=64 differs from the pre-trained encoder's 32"):
        train([*args, f"out_dir={tmp_path / 'a'}", f"init_from={mlm_run}", "model.d_model=64"])
    # learned positions end at the encoder's max_len: a longer one is refused before any batch
    tok = load_encoder_tokenizer(mlm_run / "best")
    short = EncoderModel(EncoderConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=2, d_ff=64, n_layers=1,
                                       dropout=0.0, positional="learned", max_len=48))  # fmt: skip
    save_model(short, tmp_path / "short", objective="mlm")
    tok.save(tmp_path / "short")
    with pytest.raises(ConfigError, match=r"max_len=64 is over the 48 positions the pre-trained encoder"):
        train([*args, f"out_dir={tmp_path / 'c'}", f"init_from={tmp_path / 'short'}", "max_len=64"])
    # ... and at the rows it was trained on: its trained_max_len, or (a run from before it) its run's max_len
    wide = EncoderModel(EncoderConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=2, d_ff=64, n_layers=1,
                                      dropout=0.0, positional="learned", max_len=512))  # fmt: skip
    save_model(wide, tmp_path / "wide", objective="mlm", trained_max_len=32)
    save_model(wide, tmp_path / "old" / "step-000010", objective="mlm")
    (tmp_path / "old" / "train_config.json").write_text('{"max_len": 40}', encoding="utf-8")
    tok.save(tmp_path / "wide")
    tok.save(tmp_path / "old" / "step-000010")
    for init_from, rows in ((tmp_path / "wide", 32), (tmp_path / "old", 40)):
        with pytest.raises(ConfigError, match=rf"max_len=64 is over the {rows} positions the pre-trained"):
            train([*args, f"out_dir={tmp_path / 'd'}", f"init_from={init_from}", "max_len=64"])
    assert MaskFiller.from_dir(tmp_path / "wide").max_len == 32  # fill-mask reads no untrained row either
    assert EncoderService("wide", tmp_path / "wide").filler.max_len == 32
    with pytest.raises(DataError, match=r"this model reads at most 30"):
        MaskFiller.from_dir(tmp_path / "wide").fill(" ".join(["film"] * 40) + " <mask>")
    (tmp_path / "lm").mkdir()
    with pytest.raises(ModelDirError, match=r"init_from="):
        train([*args, f"out_dir={tmp_path / 'b'}", f"init_from={tmp_path / 'lm'}"])


@pytest.fixture(scope="module")
def classify_run(rule_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("cls") / "run"
    train(["task=classify", f"dataset={rule_data}", f"out_dir={run}", "max_steps=20", "eval_every=20",
           *TINY, "model.n_layers=2"])  # fmt: skip
    return run


def test_keep_classifier_and_reinit_layers(classify_run, mlm_run, rule_data, tmp_path):
    """keep_classifier loads the head too; reinit_layers=1 leaves the top layer as initialised."""
    run = tmp_path / "ft"
    train(["task=classify", f"dataset={rule_data}", f"out_dir={run}", f"init_from={classify_run}",
           "keep_classifier=true", "reinit_layers=1", "max_steps=1", "eval_every=1", *TINY,
           "model.n_layers=2", "lr=1e-12"])  # fmt: skip
    pre = load_file(classify_run / "best" / "model.safetensors")
    tuned = load_model(run / "step-000001").state_dict()
    top = [k for k in pre if k.startswith("encoder.layers.1.") and k.endswith("weight") and pre[k].dim() == 2]
    kept = [k for k in pre if not k.startswith("encoder.layers.1.")]
    assert {k for k in kept if k.startswith("classifier.")} and len(top) == 4
    assert all(torch.allclose(tuned[k], pre[k], atol=1e-9) for k in kept)
    assert not any(torch.allclose(tuned[k], pre[k], atol=1e-3) for k in top)
    with pytest.raises(ConfigError, match=r"keep_classifier=True needs a classifier in init_from=.*none"):
        train(["task=classify", f"dataset={rule_data}", f"out_dir={tmp_path / 'b'}", "keep_classifier=true",
               f"init_from={mlm_run}", *TINY])  # fmt: skip
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for split in ("train", "dev"):
        text = (rule_data / f"{split}.tsv").read_text(encoding="utf-8")
        (renamed / f"{split}.tsv").write_text(text.replace("\tneg", "\tzero"), encoding="utf-8")
    keep = ["task=classify", f"init_from={classify_run}", "keep_classifier=true", *TINY, "model.n_layers=2"]
    with pytest.raises(
        ConfigError, match=r"labels \['neg', 'pos'\] to be the training labels \['pos', 'zero'\]"
    ):
        train([*keep, f"dataset={renamed}", f"out_dir={tmp_path / 'c'}"])
    with pytest.raises(
        ConfigError, match=r"model.pooling='first' differs .* \(keep_classifier keeps the pooling"
    ):
        train([*keep, f"dataset={rule_data}", f"out_dir={tmp_path / 'd'}", "model.pooling=first"])


def test_layer_decay_scales_each_layers_learning_rate(rule_data, tmp_path):
    """decay 0.5 over 2 layers: embeddings × 0.125, layer 0 × 0.25, layer 1 × 0.5, the final norm and
    the heads × 1, after a step and after a resume (the groups keep their scales in the checkpoint)."""
    args = ["task=classify", f"dataset={rule_data}", f"out_dir={tmp_path / 'r'}", "eval_every=2",
            "layer_decay=0.5", "weight_decay=0.01", *TINY, "model.n_layers=2", "model.norm_first=true",
            "model.embed_norm=true", "model.pooling=first", "model.pooler=true", "warmup=4"]  # fmt: skip
    expected = {"embed.": 0.125, "encoder.layers.0.": 0.25, "encoder.layers.1.": 0.5, "encoder.norm.": 1,
                "classifier.": 1}  # fmt: skip
    for steps, resume in ((2, False), (4, True)):
        trainer = Trainer(load_recipe(None, [*args, f"max_steps={steps}"]), resume=resume)
        trainer.fit()
        base = 0.003 * min(steps, 4) / 4  # the last step's rate: linear warm-up over 4 steps
        lr_of = {id(p): g["lr"] for g in trainer.optimizer.param_groups for p in g["params"]}
        for name, p in trainer.model.named_parameters():
            factor = next((f for prefix, f in expected.items() if name.startswith(prefix)), None)
            assert factor is not None, f"{name}: no expected scale"
            assert lr_of[id(p)] == pytest.approx(base * factor), name
    groups = trainer.optimizer.param_groups  # a (scale, decay) pair each; the tied embedding has no bias
    assert len(groups) == 8 and all(g["weight_decay"] == (0.01 if p.dim() >= 2 else 0.0)
                                    for g in groups for p in g["params"])  # fmt: skip


@pytest.fixture(scope="module")
def rtd_run(rule_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("rtd") / "run"
    train(["task=rtd", f"dataset={rule_data / 'train.tsv'}", f"out_dir={run}", "max_steps=60",
           "eval_every=30", "whole_word_mask=true", *TINY])  # fmt: skip
    return run


def test_rtd_learns_to_detect_and_is_no_mask_filler(rtd_run):
    valid = [m for m in metrics(rtd_run) if m["split"] == "valid"]
    assert {"accuracy", "precision", "recall", "f1"} <= set(valid[-1])
    assert valid[-1]["f1"] > 5 and valid[-1]["loss"] < valid[0]["loss"]
    meta = json.loads((rtd_run / "best" / "config.json").read_text())
    assert meta["objective"] == "rtd" and meta["replace_from"] == "unigram" and meta["config"]["detector"]
    with pytest.raises(ModelDirError, match=r"objective 'rtd'.*fill-mask needs a model trained with task"):
        MaskFiller.from_dir(rtd_run)


def test_init_from_an_rtd_encoder_leaves_the_detector_behind(rtd_run, rule_data, tmp_path):
    run = tmp_path / "ft"
    train(["task=classify", f"dataset={rule_data}", f"out_dir={run}", f"init_from={rtd_run}", "max_steps=1",
           "eval_every=1", *TINY, "lr=1e-12"])  # fmt: skip
    pre = load_file(rtd_run / "best" / "model.safetensors")
    tuned = load_model(run / "step-000001")
    state = tuned.state_dict()
    shared = [k for k in pre if not k.startswith("detector.")]
    assert shared and all(torch.allclose(state[k], pre[k], atol=1e-9) for k in shared)
    assert not any(k.startswith("detector.") for k in state) and not tuned.config.detector


@pytest.fixture(scope="module")
def clm_run(rule_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("clm") / "run"
    train(["task=clm", f"dataset={rule_data / 'train.tsv'}", f"out_dir={run}", "max_steps=60",
           "eval_every=30", "packing=blocks", "max_len=32", *TINY])  # fmt: skip
    return run


def test_clm_learns_the_next_piece_and_is_no_mask_filler(clm_run):
    valid = [m for m in metrics(clm_run) if m["split"] == "valid"]
    # random filler words: well under what a leaked target (the input itself) would give
    assert valid[-1]["loss"] < valid[0]["loss"] and 10 < valid[-1]["accuracy"] < 80
    meta = json.loads((clm_run / "best" / "config.json").read_text())
    assert meta["objective"] == "clm" and meta["config"]["causal"] and meta["packing"] == "blocks"
    with pytest.raises(ModelDirError, match=r"objective 'clm'.*fill-mask needs a model trained with task"):
        MaskFiller.from_dir(clm_run)
    assert EncoderService("clm", clm_run).filler is None  # the server offers no fill-mask either


@pytest.mark.parametrize("packing", ["sentences", "blocks"])
def test_clm_batches_shift_by_one_and_score_no_padding_nor_a_blocks_closing_eos(rule_data, tmp_path, packing):
    data = rule_data / "train.tsv"
    trainer = Trainer(load_recipe(None, ["task=clm", f"dataset={data}", f"packing={packing}",
                                         f"out_dir={tmp_path / 'r'}", *TINY]))  # fmt: skip
    task, bos, eos, pad = trainer.task, 1, 2, 0
    assert (task.tok.bos_id, task.tok.eos_id, task.tok.pad_id) == (bos, eos, pad)
    batch = task._batch([np.array([5, 6]), np.array([7, 8, 9])])
    assert batch.ids.tolist() == [[bos, 5, 6, eos], [bos, 7, 8, 9]]
    last = pad if packing == "blocks" else eos  # a block's closing eos is where the stream was cut
    assert batch.targets.tolist() == [[5, 6, last, pad], [7, 8, 9, last]]
    assert task.n_targets(batch) == (5 if packing == "blocks" else 7)


def test_clm_scores_no_eos_after_a_sentence_cut_at_max_len(rule_data, tmp_path):
    """A line longer than max_len - 2 pieces is cut, and its eos marks the cut, not the text's end:
    no target, as a block's closing eos; a line that fits keeps its eos as a target."""
    data = rule_data / "train.tsv"
    trainer = Trainer(load_recipe(None, ["task=clm", f"dataset={data}", "packing=sentences", "max_len=5",
                                         f"out_dir={tmp_path / 'r'}", *TINY]))  # fmt: skip
    task, bos, eos, pad = trainer.task, 1, 2, 0
    batch = task._batch([np.array([5, 6]), np.array([7, 8, 9, 10])])
    assert batch.ids.tolist() == [[bos, 5, 6, eos], [bos, 7, 8, 9]]
    assert batch.targets.tolist() == [[5, 6, eos, pad], [7, 8, 9, pad]]


@pytest.mark.parametrize("causal", [True, False])
def test_init_from_a_clm_encoder_keeps_or_drops_the_look_ahead_mask(clm_run, rule_data, tmp_path, causal):
    run = tmp_path / "ft"
    train(["task=classify", f"dataset={rule_data}", f"out_dir={run}", f"init_from={clm_run}", "max_steps=1",
           "eval_every=1", f"model.causal={str(causal).lower()}", *TINY, "lr=1e-12"])  # fmt: skip
    pre = load_file(clm_run / "best" / "model.safetensors")
    tuned = load_model(run / "step-000001")
    state = tuned.state_dict()
    assert all(torch.allclose(state[k], pre[k], atol=1e-9) for k in pre) and tuned.config.causal is causal


@pytest.mark.parametrize("task", ["mlm", "rtd", "clm", "classify word_dropout=0.3"])
def test_a_resumed_run_continues_with_the_same_corruption(rule_data, tmp_path, task):
    """Masks, replacements and left-out words are seeded by the batch's place in the epochs."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    name, *extra = task.split()
    base = [f"task={name}", *extra, f"dataset={rule_data / 'train.tsv'}", "eval_every=10", *TINY]
    train([*base, f"out_dir={straight}", "max_steps=20"])
    train([*base, f"out_dir={split}", "max_steps=10"])
    train([*base, f"out_dir={split}", "max_steps=20"], resume=True)
    a = [m["loss"] for m in metrics(straight) if m["split"] == "train"]
    b = [m["loss"] for m in metrics(split) if m["split"] == "train"]
    assert a == pytest.approx(b, rel=1e-5)


def test_a_lowercase_vocabulary_and_the_first_validation_documents(rule_data, tmp_path):
    """``lowercase``: the run's vocabulary lowercases (as fill-mask and fine-tuning will read text);
    ``eval_max_sentences``: packed validation blocks are exactly the first N dev rows, separated."""
    dev = rule_data / "dev.tsv"
    trainer = Trainer(load_recipe(None, [
        "task=mlm", f"dataset={rule_data / 'train.tsv'}", f"valid_dataset={dev}", f"out_dir={tmp_path / 'r'}",
        "packing=blocks", "lowercase=true", "eval_max_sentences=5", "max_len=16", *TINY]))  # fmt: skip
    task = trainer.task
    assert task.tok.lowercase and task.tok.encode("THE Great FILM") == task.tok.encode("the great film")
    first = [line.split("\t")[0] for line in dev.read_text().splitlines()[1:6]]
    expected = [i for text in first for i in [*task.tok.encode(text), task.tok.eos_id]]
    assert [int(i) for block in task.valid for i in block] == expected
    assert all(len(block) == 14 for block in list(task.valid)[:-1])
    with pytest.raises(ConfigError, match=r"lowercase=True trains a lowercasing vocabulary; init_from="):
        load_recipe(None, ["task=classify", f"init_from={tmp_path}", "lowercase=true"])


@pytest.mark.parametrize(
    "task, override, match",
    [
        ("mlm", "mask_prob=0", r"mask_prob=0.0 must be in \(0, 1\]"),
        ("mlm", "random_token_prob=0.5", r"random_token_prob=0.5 \+ mask_token_prob=0.8 is more than 1"),
        ("mlm", "model.n_classes=3", r"model.n_classes is for task='classify'"),
        ("mlm", "eval_max_sentences=-1", r"eval_max_sentences=-1 must be ≥ 0"),
        ("rtd", "replace_prob=0", r"replace_prob=0.0 must be in \(0, 1\)"),
        ("rtd", "replace_from=bert", r"replace_from='bert' is not one of \('unigram', 'uniform'\)"),
        ("rtd", "model.head_transform=true", r"model.head_transform=True shapes the vocabulary head"),
        ("clm", "model.causal=false", r"model.causal=false: causal-LM pre-training needs the look-ahead"),
        ("clm", "whole_word_mask=true", r"whole_word_mask=True chooses what masked-LM predicts"),
        ("clm", "mask_prob=0.3", r"mask_prob=0.3 is masked-LM's .* task='clm' does not take it"),
        ("classify", "class_weights=inverse", r"class_weights='inverse' is not one of"),
        ("classify", "model.n_classes=3", r"model.n_classes is set from the training labels"),
        ("classify", "tokenizer=char", r"tokenizer='char' is for task='lm'"),
        ("classify", "model.pooling=cls", r"pooling='cls' is not one of \('mean', 'first', 'max'\)"),
        (
            "rtd",
            "mask_prob=0.3",
            r"mask_prob=0.3 is masked-LM's .* task='rtd' does not take it \(remove",
        ),
        ("mlm", "layer_decay=0.8", r"layer_decay=0.8 is fine-tuning's .* task='mlm' does not take it"),
        (
            "classify",
            "replace_prob=0.2",
            r"replace_prob=0.2 is replaced-token .* task='classify' does not",
        ),
        ("classify", "keep_classifier=true", r"keep_classifier=True is for fine-tuning: set init_from"),
        ("classify", "reinit_layers=1", r"reinit_layers=1 is for fine-tuning: set init_from"),
        ("classify", "layer_decay=0", r"layer_decay=0.0 must be in \(0, 1\] \(1 = one learning rate"),
        ("classify", "word_dropout=1", r"word_dropout=1.0 must be in \[0, 1\) \(the share of training"),
        ("mlm", "word_dropout=0.1", r"word_dropout=0.1 leaves pieces out .* task='mlm' does not take it"),
        ("mlm", "model.detector=true", r"model.detector is task='rtd''s head; task='mlm' would never"),
        ("clm", "model.detector=true", r"task='clm' would never train it"),
        ("classify", "extra_text=[\"more.txt\"]", r"extra_text=\['more.txt'\] adds pre-training text"),
        ("classify", "packing=blocks",
         r"packing='blocks' cuts pre-training text into blocks .* task='classify' does not take it"),
        ("classify", "whole_word_mask=true", r"whole_word_mask=True masks whole words for pre-training"),
        ("translation", "batch_size=64", r"batch_size=64 is a language model's windows per batch"),
        ("mlm", "block_size=128", r"block_size=128 is a language model's context"),
        ("classify", "model.positional=learned model.max_len=40 max_len=64",
         r"model.max_len=40: learned positions cannot hold the 64 positions that max_len=64 allows; "
         r"raise model.max_len to 64 or lower max_len"),
    ],
)  # fmt: skip
def test_bad_encoder_configs(task, override, match):
    with pytest.raises(ConfigError, match=match):
        load_recipe(None, [f"task={task}", *override.split()])


@pytest.mark.parametrize("third_class", [True, False])
def test_a_table_sorted_by_label_says_that_its_last_tenth_validates(rule_data, tmp_path, capsys, third_class):
    """One file, sorted by label: its last tenth (validation) holds a class that no training row has
    (before: "not one the model was trained on", as if the model were wrong), or lacks one (before:
    scores over one class, silently)."""
    rows = (rule_data / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    neg, pos = [r for r in rows if r.endswith("neg")], [r for r in rows if r.endswith("pos")]
    if third_class:  # 150 neg, 150 pos, 30 "zzz": the last 33 rows are 3 pos and every zzz
        ordered = neg[:150] + pos[:150] + [r.replace("\tneg", "\tzzz") for r in neg[150:180]]
    else:  # 300 neg, 300 pos: the last 60 rows are pos
        ordered = neg + pos
    sorted_file = tmp_path / "sorted.tsv"
    sorted_file.write_text("sentence\tlabel\n" + "\n".join(ordered) + "\n", encoding="utf-8")
    args = ["train", "task=classify", f"dataset={sorted_file}", f"out_dir={tmp_path / 'run'}", "max_steps=1",
            "eval_every=1", *TINY]  # fmt: skip
    fix = "the validation rows are the file's last tenth: shuffle the file, or give valid_dataset=FILE"
    if third_class:
        assert main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "label 'zzz' is not one the model was trained on" in err[0], err
        assert err[0].endswith(fix)
    else:
        assert main(args) == 0
        warning = f"warning: no validation row has label(s) 'neg', so its scores leave that class out; {fix}"
        assert warning in capsys.readouterr().err
