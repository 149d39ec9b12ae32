"""Export to Hugging Face BERT: ``BertForMaskedLM`` / ``BertForSequenceClassification`` loaded by
transformers compute aiayn's logits within 1e-4; what does not map is refused by name."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from aiayn import EncoderConfig, EncoderModel  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.data import SentencePieceTokenizer  # noqa: E402
from aiayn.errors import ModelDirError  # noqa: E402
from aiayn.interop.bert import export_bert  # noqa: E402
from aiayn.models.io import save_model  # noqa: E402
from tests.helpers import assert_close  # noqa: E402

BERT = dict(embed_norm=True, head_transform=True, output_bias=True, positional="learned", activation="gelu",
            emb_scale="none", ln_eps=1e-12)  # fmt: skip
BERT.update(d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=40, dropout=0.0)


def model(**kw) -> EncoderModel:
    torch.manual_seed(0)
    m = EncoderModel(EncoderConfig(vocab_size=60, **{**BERT, **kw})).eval()
    with torch.no_grad():  # make every tensor matter: random biases and norms, not init's zeros and ones
        for name, p in m.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return m


def batch():
    ids = torch.randint(5, 60, (3, 9))
    ids[:, 0] = 1
    ids[1, 6:], ids[1, 5] = 0, 2
    return ids, (ids != 0).long()


@pytest.mark.parametrize(
    "kw", [{}, dict(tie_output=False), dict(activation="relu"), dict(activation="gelu_tanh")]
)
def test_masked_lm_logits_equal_transformers(kw, tmp_path):
    m = model(**kw)
    export_bert(m, tmp_path)
    hf = transformers.BertForMaskedLM.from_pretrained(tmp_path).eval()
    ids, mask = batch()
    with torch.no_grad():
        ours, theirs = m(ids), hf(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert_close(f"BertForMaskedLM logits {kw}", ours[real], theirs[real], atol=1e-4)


def test_classifier_logits_and_labels_equal_transformers(tmp_path):
    m = model(n_classes=3, pooling="first", pooler=True)
    export_bert(m, tmp_path, ["neg", "neutral", "pos"])
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    ids, mask = batch()
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).logits
        assert_close("BertForSequenceClassification logits", m.classify(ids), theirs, atol=1e-4)
    assert hf.config.id2label == {0: "neg", 1: "neutral", 2: "pos"}


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(norm_first=True), "norm_first"),
        (dict(positional="sinusoidal"), "positional"),
        (dict(embed_norm=False), "embed_norm"),
        (dict(emb_scale="emb"), "emb_scale"),
        (dict(head_transform=False), "head_transform"),
        (dict(n_classes=2, pooling="mean", pooler=True), "pooling"),
        (dict(n_classes=2, pooling="first", pooler=False), "pooler"),
    ],
)
def test_what_does_not_map_is_refused_by_name(kw, field, tmp_path):
    with pytest.raises(ModelDirError, match=rf"EncoderConfig.{field}="):
        export_bert(model(**kw), tmp_path)


def test_export_from_the_command_line_keeps_labels_and_tokenizer(tmp_path, capsys):
    tok = SentencePieceTokenizer.train(["a good film", "a bad film", "the plot"] * 50, 300, mask=True)
    torch.manual_seed(0)
    m = EncoderModel(EncoderConfig(vocab_size=tok.vocab_size, n_classes=2, pooling="first", pooler=True,
                                   **{**BERT, "max_len": 64}))  # fmt: skip
    save_model(m, tmp_path / "model", labels=["negative", "positive"])
    tok.save(tmp_path / "model")
    assert main(["export", "--model", str(tmp_path / "model"), "--to", "hf", str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (
        config["architectures"] == ["BertForSequenceClassification"] and config["id2label"]["1"] == "positive"
    )
    assert (tmp_path / "hf" / "spm.model").is_file()
    mean = EncoderModel(EncoderConfig(vocab_size=tok.vocab_size, n_classes=2, **{**BERT, "max_len": 64}))
    save_model(mean, tmp_path / "mean", labels=["negative", "positive"])
    tok.save(tmp_path / "mean")
    assert main(["export", "--model", str(tmp_path / "mean"), "--to", "hf", str(tmp_path / "hf2")]) == 1
    assert "EncoderConfig.pooling='mean', BERT needs 'first'" in capsys.readouterr().err
    assert not (tmp_path / "hf2").exists()
