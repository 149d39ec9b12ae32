"""Fine-tuning an imported BERT, with transformers as the reference: ``aiayn train task=classify
init_from=DIR`` on a random-initialised ``BertForSequenceClassification`` whose [PAD]/[CLS]/[SEP]
are not aiayn's 0/1/2 takes the same steps as a plain PyTorch loop over the HF model (same batches,
same Adam, dropout off), and its export loads back into transformers, tokenizer included."""

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from aiayn.cli.main import main  # noqa: E402
from aiayn.errors import ConfigError  # noqa: E402
from aiayn.interop.model_dir import load_encoder_dir  # noqa: E402
from aiayn.training.recipe import load_recipe  # noqa: E402
from aiayn.training.trainer import Trainer  # noqa: E402
from tests.helpers import assert_close  # noqa: E402

# specials away from 0, 1, 2, so that aiayn's default ids would feed the wrong tokens
VOCAB = ["the", "a", "film", "good", "bad", "[UNK]", "plot", "[SEP]", "is", "dull", "[CLS]", "great",
         "[PAD]", "[MASK]", "movie", "boring", "fine", "##s", "acting", "and", "not"]  # fmt: skip
TRAIN = [("pos", "a good film"), ("neg", "the plot is dull"), ("pos", "great acting and a fine plot"),
         ("neg", "a boring movie"), ("pos", "the films is great"), ("neg", "not good , bad acting"),
         ("pos", "fine"), ("neg", "dull dull plot and bad films")]  # fmt: skip
STEPS, LR, WEIGHT_DECAY, BETAS, EPS = 5, 3e-3, 0.01, (0.9, 0.999), 1e-8
CLIP = 0.5  # a gradient-norm limit the first updates pass (asserted below), so that clipping acts


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A random BertForSequenceClassification (biases, norms and token types non-trivial) saved with
    its WordPiece tokenizer files."""
    d = tmp_path_factory.mktemp("bert")
    (d / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
    transformers.BertTokenizer(str(d / "vocab.txt")).save_pretrained(d)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, pad_token_id=VOCAB.index("[PAD]"),
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or "token_type" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(d)
    return d


def test_fine_tuning_an_imported_bert_equals_a_plain_loop_over_transformers(bert_dir, tmp_path):
    ref_tok = transformers.BertTokenizer.from_pretrained(bert_dir)
    assert (ref_tok.pad_token_id, ref_tok.cls_token_id, ref_tok.sep_token_id) == (12, 10, 7)
    data = tmp_path / "data"
    data.mkdir()
    for split, rows in (("train", TRAIN), ("dev", TRAIN[:4])):
        text = "label\ttext\n" + "".join(f"{y}\t{x}\n" for y, x in rows)
        (data / f"{split}.tsv").write_text(text, encoding="utf-8")
    # the whole training set is one batch, so every update sees the same rows on both sides
    args = ["task=classify", f"dataset={data}", f"init_from={bert_dir}", f"max_steps={STEPS}",
            f"eval_every={STEPS}", "log_every=1", "max_tokens=4096", "max_len=32", "schedule=constant",
            "warmup=0", f"lr={LR}", "label_smoothing=0", "optimizer=adamw", f"weight_decay={WEIGHT_DECAY}",
            f"beta1={BETAS[0]}", f"beta2={BETAS[1]}", f"adam_eps={EPS}", f"clip_norm={CLIP}",
            "model.dropout=0", "model.attn_dropout=0", "model.pooling=first", "progress=false",
            "threads=1"]  # fmt: skip

    # aiayn's initial model: the imported encoder and the new (seeded) head
    trainer = Trainer(load_recipe(None, [*args, f"out_dir={tmp_path / 'init'}"]))
    start = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    c = trainer.model.config
    assert (c.pad_id, c.bos_id, c.eos_id, c.unk_id) == (12, 10, 7, 5)  # the checkpoint's, not 0, 1, 2, 3
    trainer.release()

    run = tmp_path / "run"
    assert main(["train", *args, f"out_dir={run}"]) == 0
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ours = [r["loss"] for r in logged if r.get("split", "train") == "train"]
    labels = json.loads((run / f"step-{STEPS:06d}" / "config.json").read_text())["labels"]

    # the plain loop: the HF model with aiayn's new head, token type 0 folded into the positions (as
    # aiayn imports it) and frozen, so that both optimise the same function of the same tensors
    hf = transformers.BertForSequenceClassification.from_pretrained(bert_dir)
    emb = hf.bert.embeddings
    with torch.no_grad():
        emb.position_embeddings.weight += emb.token_type_embeddings.weight[0]
        emb.token_type_embeddings.weight.zero_()
        hf.bert.pooler.dense.weight.copy_(start["classifier.pooler.weight"])
        hf.bert.pooler.dense.bias.copy_(start["classifier.pooler.bias"])
        hf.classifier.weight.copy_(start["classifier.out.weight"])
        hf.classifier.bias.copy_(start["classifier.out.bias"])
    emb.token_type_embeddings.weight.requires_grad_(False)
    params = [p for p in hf.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    texts = [x for _, x in TRAIN]
    enc = ref_tok(texts, padding=True, return_tensors="pt")
    y = torch.tensor([labels.index(label) for label, _ in TRAIN])
    hf.train()
    theirs, norms = [], []
    for _ in range(STEPS):
        loss = hf(**enc, labels=y).loss  # the mean over the batch, as aiayn's summed loss / targets
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, CLIP).item())
        optimizer.step()
        optimizer.zero_grad()
        theirs.append(loss.item())
    assert len(ours) == STEPS and ours[-1] < ours[0] and max(norms) > CLIP
    assert_close("losses, aiayn vs a plain loop", torch.tensor(ours), torch.tensor(theirs), atol=1e-4)

    # the export loads into transformers and computes aiayn's logits (and the plain loop's)
    out = tmp_path / "hf"
    assert main(["export", "--model", str(run), "--to", "hf", str(out)]) == 0
    model, tok, _ = load_encoder_dir(run)
    rows = [torch.tensor([tok.bos_id, *tok.encode(t), tok.eos_id]) for t in texts]
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=tok.pad_id)
    assert torch.equal(ids, enc["input_ids"])
    again = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    hf.eval()
    with torch.no_grad():
        want = model.classify(ids)
        assert_close("exported logits", again(**enc).logits, want, atol=1e-4)
        assert_close("plain loop's logits", hf(**enc).logits, want, atol=1e-4)

    # and its tokenizer files are transformers': the fast tokenizer reads them
    auto = transformers.AutoTokenizer.from_pretrained(out)
    sentence = "the films is not great , a boring plot"
    assert auto(sentence)["input_ids"] == [tok.bos_id, *tok.encode(sentence), tok.eos_id]
    assert load_encoder_dir(out)[1].encode(sentence) == tok.encode(sentence)
    # truncation cuts where the run read (max_len=32), so a long text classifies instead of failing
    long = auto(" ".join([sentence] * 20), truncation=True, return_tensors="pt")
    assert auto.model_max_length == 32 and long["input_ids"].size(1) == 32
    with torch.no_grad():
        assert again(**long).logits.shape == (1, 2)


def test_keep_classifier_loads_a_bert_classifiers_head_when_its_labels_are_ours(bert_dir, tmp_path):
    """``keep_classifier`` reads a HF classifier's labels from ``id2label``: LABEL_0/1 are refused for
    neg/pos; named neg/pos, the run starts from HF's own pooler and classifier tensors."""
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "dev"):
        text = "label\ttext\n" + "".join(f"{y}\t{x}\n" for y, x in TRAIN)
        (data / f"{split}.tsv").write_text(text, encoding="utf-8")
    args = ["task=classify", f"dataset={data}", "keep_classifier=true", "max_steps=1", "max_tokens=4096",
            "max_len=32", "model.pooling=first", "progress=false", "threads=1"]  # fmt: skip
    with pytest.raises(ConfigError, match=r"init_from's labels \['LABEL_0', 'LABEL_1'\] to be the training "
                       r"labels \['neg', 'pos'\]"):  # fmt: skip
        Trainer(load_recipe(None, [*args, f"init_from={bert_dir}", f"out_dir={tmp_path / 'a'}"]))
    named = tmp_path / "named"
    shutil.copytree(bert_dir, named)
    config = json.loads((named / "config.json").read_text())
    config.update(id2label={"0": "neg", "1": "pos"}, label2id={"neg": 0, "pos": 1})
    (named / "config.json").write_text(json.dumps(config))
    trainer = Trainer(load_recipe(None, [*args, f"init_from={named}", f"out_dir={tmp_path / 'b'}"]))
    hf = transformers.BertForSequenceClassification.from_pretrained(named)
    ours = trainer.model.state_dict()
    for mine, theirs in (("classifier.out", hf.classifier), ("classifier.pooler", hf.bert.pooler.dense)):
        assert torch.equal(ours[f"{mine}.weight"].cpu(), theirs.weight) and torch.equal(
            ours[f"{mine}.bias"].cpu(), theirs.bias
        )
    trainer.release()


def test_a_bert_with_more_embedding_rows_than_words_fine_tunes_loads_back_and_fills_masks(tmp_path, capsys):
    """Some checkpoints pad their embedding past vocab.txt: the fine-tuned run loads as the import did,
    fill-mask never offers a row without a word, and each filled sentence still shows its other masks."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(VOCAB) + 8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, pad_token_id=VOCAB.index("[PAD]"),
    )  # fmt: skip
    heads = {"clf": transformers.BertForSequenceClassification, "mlm": transformers.BertForMaskedLM}
    for name, cls in heads.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
        transformers.BertTokenizer(str(tmp_path / name / "vocab.txt")).save_pretrained(tmp_path / name)
        cls(config).save_pretrained(tmp_path / name)
    data = tmp_path / "data.tsv"
    data.write_text("label\ttext\n" + "".join(f"{y}\t{x}\n" for y, x in TRAIN * 2), encoding="utf-8")
    run = tmp_path / "run"
    Trainer(load_recipe(None, ["task=classify", f"dataset={data}", f"init_from={tmp_path / 'clf'}",
                               f"out_dir={run}", "max_steps=1", "max_len=32", "progress=false",
                               "threads=1"])).fit()  # fmt: skip
    model, tok, _ = load_encoder_dir(run)
    assert (model.config.vocab_size, tok.vocab_size) == (len(VOCAB) + 8, len(VOCAB))
    (tmp_path / "in.txt").write_text("a good film\n", encoding="utf-8")
    assert main(["classify", "--model", str(run), "--input", str(tmp_path / "in.txt")]) == 0
    capsys.readouterr()
    query = "a <mask> film is <mask>"
    assert main(["fill-mask", "--model", str(tmp_path / "mlm"), "--top-k", "50", "--json", query]) == 0
    masks = json.loads(capsys.readouterr().out)
    after_mask = {tok.decode([j]) for j in range(VOCAB.index("[MASK]") + 1, len(VOCAB))}  # no spare row
    assert all({f["token"] for f in fillers} == after_mask for fillers in masks)
    assert all(f["sequence"].count("<mask>") == 1 for fillers in masks for f in fillers)
    assert masks[0][0]["sequence"] == f"a {masks[0][0]['token']} film is <mask>"
