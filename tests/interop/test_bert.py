"""BERT in and out, with transformers as the reference: aiayn's exports loaded by
``BertForMaskedLM`` / ``BertForSequenceClassification`` compute aiayn's logits, random-initialised
transformers checkpoints loaded by aiayn compute transformers' logits (within 1e-4), what does not
map is refused by name, and the WordPiece tokenizer gives ``BertTokenizer``'s ids and text."""

import json
import random
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from aiayn import EncoderConfig, EncoderModel  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.data import SentencePieceTokenizer  # noqa: E402
from aiayn.decoding.classifier import MaskFiller, TextClassifier  # noqa: E402
from aiayn.errors import ModelDirError  # noqa: E402
from aiayn.interop import export_hf, from_pretrained  # noqa: E402
from aiayn.interop.bert import WordPieceTokenizer, export_bert, load_bert, load_bert_tokenizer  # noqa: E402
from aiayn.interop.model_dir import load_encoder_dir, model_meta  # noqa: E402
from aiayn.models.io import save_model  # noqa: E402
from tests.helpers import assert_close  # noqa: E402
from tests.interop.hf_builders import padded_ids  # noqa: E402

BERT = dict(embed_norm=True, head_transform=True, output_bias=True, positional="learned", activation="gelu",
            emb_scale="none", ln_eps=1e-12)  # fmt: skip
BERT.update(d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=40, dropout=0.0)
CLASSIFIER = dict(n_classes=3, pooling="first", pooler=True)


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


# -- export: aiayn -> transformers ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {},
        dict(tie_output=False),
        dict(activation="relu"),
        dict(activation="gelu_tanh"),
        dict(activation="silu", bias=False, output_bias=False),  # zero biases
        dict(emb_scale="emb"),  # √d_model folded into the word embeddings, untied
        dict(emb_scale="emb", tie_output=False),
        dict(emb_scale="prj"),  # ÷√d_model folded into the decoder, untied
    ],
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
    again = load_bert(tmp_path)  # and aiayn reads its own export back
    with torch.no_grad():
        assert_close(f"BERT export read back {kw}", again(ids)[real], ours[real], atol=1e-5)


def test_classifier_logits_and_labels_equal_transformers(tmp_path):
    m = model(**CLASSIFIER)
    export_hf(m, tmp_path / "plain")  # export_hf dispatches an EncoderModel to BERT
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["id2label"]["2"] == "2"
    export_bert(m, tmp_path / "labelled", ["neg", "neutral", "pos"])
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "labelled").eval()
    ids, mask = batch()
    with torch.no_grad():
        ours = m.classify(ids)
        theirs = hf(input_ids=ids, attention_mask=mask).logits
        assert_close("BertForSequenceClassification logits", ours, theirs, atol=1e-4)
        second = hf(input_ids=ids, attention_mask=mask, token_type_ids=torch.ones_like(ids)).logits
        assert_close("BertForSequenceClassification logits, segment B", ours, second, atol=1e-4)
    assert hf.config.id2label == {0: "neg", 1: "neutral", 2: "pos"}
    with pytest.raises(ModelDirError, match="2 labels for a model with n_classes=3"):
        export_bert(m, tmp_path / "two", ["neg", "pos"])


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(norm_first=True), "norm_first"),
        (dict(positional="sinusoidal"), "positional"),
        (dict(embed_norm=False), "embed_norm"),
        (dict(d_k=4), "d_k"),
        (dict(d_v=16), "d_v"),
        (dict(head_transform=False), "head_transform"),
        (dict(n_classes=2, pooling="mean", pooler=True), "pooling"),
        (dict(n_classes=2, pooling="first", pooler=False), "pooler"),
        (dict(n_heads=3, d_k=8, d_v=8), "d_model"),
        (dict(detector=True), "detector"),
        (dict(detector=True, **CLASSIFIER), "detector"),
        (dict(causal=True), "causal"),
        (dict(attn_window=2), "attn_window"),
    ],
)
def test_what_does_not_map_is_refused_by_name(kw, field, tmp_path):
    with pytest.raises(ModelDirError, match=rf"cannot export as BERT: EncoderConfig.{field}="):
        export_bert(model(**kw), tmp_path)
    assert not (tmp_path / "config.json").exists()


# -- import: transformers -> aiayn ------------------------------------------------------------------


def hf_bert(tmp, cls=transformers.BertForMaskedLM, seed=0, **overrides):
    """A random-initialised BERT saved with ``save_pretrained``; LayerNorms, biases and the token-type
    embeddings (row 0 is folded into the positions) get random values, so that mixing any of them
    up shows."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=53, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=24, hidden_act="gelu", pad_token_id=0)  # fmt: skip
    m = cls(transformers.BertConfig(**{**kw, **overrides}))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in m.named_parameters():
            if name.endswith("LayerNorm.weight"):
                t.copy_(1 + 0.2 * torch.randn(t.shape, generator=g))
            elif name.endswith("bias") or "token_type" in name:
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
    m.save_pretrained(tmp)
    return m.eval()


def hf_batch(vocab_size: int, pad: int = 0):
    ids, mask = padded_ids([9, 5, 7], 5, vocab_size, pad=pad)
    return ids, mask


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(tie_word_embeddings=False), dict(hidden_act="relu", num_attention_heads=1, layer_norm_eps=1e-6),
     dict(hidden_act="gelu_new", num_hidden_layers=3, intermediate_size=48)],
)  # fmt: skip
def test_masked_lm_checkpoint_logits_equal_transformers(overrides, tmp_path):
    hf = hf_bert(tmp_path, **overrides)
    ours = from_pretrained(tmp_path)
    assert isinstance(ours, EncoderModel) and ours.config.n_classes == 0
    ids, mask = hf_batch(53)
    with torch.no_grad():
        theirs, got = hf(input_ids=ids, attention_mask=mask).logits, ours(ids)
    real = mask.bool()
    assert_close(f"BertForMaskedLM checkpoint {overrides}", got[real], theirs[real], atol=1e-4)


def test_pretraining_checkpoint_loads_as_its_masked_lm(tmp_path):
    """The original hub files are BertForPreTraining's: the pooler and next-sentence head are dropped."""
    hf = hf_bert(tmp_path, transformers.BertForPreTraining)
    ours = from_pretrained(tmp_path)
    ids, mask = hf_batch(53)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).prediction_logits
        assert_close(
            "BertForPreTraining prediction logits", ours(ids)[mask.bool()], theirs[mask.bool()], atol=1e-4
        )


def test_old_checkpoint_names_gamma_beta_and_buffers(tmp_path):
    """pytorch_model.bin as transformers 3 wrote TF conversions: LayerNorm gamma/beta, position_ids."""
    hf = hf_bert(tmp_path)
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in hf.state_dict().items()}  # fmt: skip
    state["bert.embeddings.position_ids"] = torch.arange(24)[None]
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    ids, mask = hf_batch(53)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).logits
        got = from_pretrained(tmp_path)(ids)
    assert_close("BERT with gamma/beta names", got[mask.bool()], theirs[mask.bool()], atol=1e-4)


def test_classifier_checkpoint_logits_and_labels(tmp_path):
    labels = {0: "sad", 1: "calm", 2: "glad"}
    hf = hf_bert(tmp_path, transformers.BertForSequenceClassification, id2label=labels,
                 label2id={v: k for k, v in labels.items()})  # fmt: skip
    ours = from_pretrained(tmp_path)
    c = ours.config
    assert (c.n_classes, c.pooling, c.pooler, c.embed_norm, c.head_transform) == (
        3,
        "first",
        True,
        True,
        False,
    )
    ids, mask = hf_batch(53)
    with torch.no_grad():
        assert_close("BertForSequenceClassification checkpoint", ours.classify(ids),
                     hf(input_ids=ids, attention_mask=mask).logits, atol=1e-4)  # fmt: skip


def test_what_aiayn_cannot_run_is_refused_on_import(tmp_path):
    hf_bert(tmp_path / "relative", position_embedding_type="relative_key")
    config = json.loads((tmp_path / "relative" / "config.json").read_text())
    if config.get("position_embedding_type") != "relative_key":  # transformers 5 no longer writes it
        config["position_embedding_type"] = "relative_key"
        (tmp_path / "relative" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelDirError, match=r"config\.json: position_embedding_type='relative_key'"):
        from_pretrained(tmp_path / "relative")
    hf_bert(tmp_path / "tokens", transformers.BertForTokenClassification)
    with pytest.raises(ModelDirError, match=r"architectures=\['BertForTokenClassification'\]"):
        from_pretrained(tmp_path / "tokens")
    hf_bert(tmp_path / "bare", transformers.BertModel)
    with pytest.raises(ModelDirError, match="a bare BertModel has nothing"):
        from_pretrained(tmp_path / "bare")
    hf_bert(tmp_path / "regression", transformers.BertForSequenceClassification, num_labels=1,
            problem_type="regression")  # fmt: skip
    with pytest.raises(ModelDirError, match="problem_type='regression'"):
        from_pretrained(tmp_path / "regression")
    hf_bert(
        tmp_path / "one-label", transformers.BertForSequenceClassification, num_labels=1
    )  # save_pretrained
    with pytest.raises(
        ModelDirError, match="num_labels=1 without a problem_type: .* regression"
    ):  # writes none
        from_pretrained(tmp_path / "one-label")  # before: a one-class classifier, every text 1.0
    hf_bert(tmp_path / "act", hidden_act="gelu_fast")
    with pytest.raises(ModelDirError, match=r"config\.json: hidden_act='gelu_fast' has no aiayn equivalent"):
        from_pretrained(tmp_path / "act")
    hf_bert(tmp_path / "weights-only")  # from_pretrained needs no tokenizer; classify and fill-mask do
    assert from_pretrained(tmp_path / "weights-only").config.pad_id == 0
    with pytest.raises(ModelDirError, match=r"weights-only has no tokenizer: expected BERT's vocab\.txt"):
        load_encoder_dir(tmp_path / "weights-only")


# -- the WordPiece tokenizer -----------------------------------------------------------------------

CORPUS = [
    "The café's crème brûlée costs $4.50 — isn't it? Naïve résumé: ÉCOLE, Straße & Ærø.",
    "北京是中国的首都。東京は日本の首都です。", "unbelievably, un-believable!!! (really) [sic] 3.14159",
    "Ο Σωκράτης ΟΔΟΣ σας", "don't do not we're I'm they've", "tokenization of words into word pieces",
]  # fmt: skip
SENTENCES = CORPUS + [
    "xyzzy qwerty unknownwordhere", "a" * 101 + " b", "Café e\u0301 CAFE\u0301 İstanbul ŁÓDŹ ǅ ß ﬁ",
    "Hello [MASK] world [CLS] x[SEP]y [mask]", "control\x00\x07chars\ufffd here", "tab\there\nnew  line",
    "nbsp\u00a0and\u3000ideographic space, zero\u200bwidth", "emoji 😀!", "", "   ", "ΣΑΣ",
]  # fmt: skip
SPECIALS = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # Google's


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def vocab_dir(request, tmp_path_factory):
    """vocab.txt trained by the tokenizers library, laid out as Google's (specials at 0 and 100-103)."""
    lower, d = request.param, tmp_path_factory.mktemp("wordpiece")
    trainer = tokenizers.BertWordPieceTokenizer(lowercase=lower)
    trainer.train_from_iterator(CORPUS * 5, vocab_size=300, min_frequency=1, special_tokens=SPECIALS)
    vocab = trainer.get_vocab()
    (d / "vocab.txt").write_text("".join(t + "\n" for t in sorted(vocab, key=vocab.get)), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
    return d


def test_wordpiece_ids_and_text_equal_bert_tokenizer(vocab_dir, tmp_path):
    ref, ours = transformers.BertTokenizer.from_pretrained(vocab_dir), load_bert_tokenizer(vocab_dir)
    assert (ours.vocab_size, ours.pad_id, ours.unk_id, ours.bos_id, ours.eos_id, ours.mask_id) == (
        len(ref), 0, 100, 101, 102, 103)  # fmt: skip
    assert sum(t.startswith("##") for t in ours.tokens) > 20  # the sentences really are cut into pieces
    for text in SENTENCES:
        ids = ours.encode(text)
        assert ids == ref(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), text
    rng = random.Random(0)
    for _ in range(200):  # any ids: specials dropped, ## joined, spaces before punctuation cleaned
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(12))]
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), ids
    assert ours.encode("Paris is the <mask> of France.") == ours.encode("Paris is the [MASK] of France.")
    ours.save(tmp_path)  # vocab.txt + tokenizer_config.json, read back by both
    assert load_bert_tokenizer(tmp_path).model_bytes() == ours.model_bytes()
    again = transformers.BertTokenizer.from_pretrained(tmp_path)
    assert again(SENTENCES[0], add_special_tokens=False)["input_ids"] == ours.encode(SENTENCES[0])


def test_wordpiece_needs_its_special_tokens(tmp_path):
    with pytest.raises(ModelDirError, match=r"lacks the special token\(s\) \['\[CLS\]'\]"):
        WordPieceTokenizer(["[PAD]", "[UNK]", "[SEP]", "a"])
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelDirError, match=r"vocab\.txt is missing"):
        load_bert_tokenizer(tmp_path)


@pytest.fixture(scope="module")
def wordpiece_pair(vocab_dir):
    """(ours, transformers') tokenizers of the cased or uncased vocabulary, for the property tests."""
    return load_bert_tokenizer(vocab_dir), transformers.BertTokenizer.from_pretrained(vocab_dir)


# pieces that exercise the special-token cut, punctuation, accents, CJK, control and space characters
PIECES = st.sampled_from(
    ["[MASK]", "[CLS]", "[mask]", "##", " ", "\t", "é", "É", "e\u0301", "漢", "—", "\x00", "'s"]
)


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.one_of(st.text(max_size=8), PIECES), max_size=8))
def test_any_text_encodes_as_bert_tokenizer(wordpiece_pair, parts):
    ours, ref = wordpiece_pair
    text = "".join(parts).replace("<mask>", "")  # aiayn's mask symbol, which BertTokenizer does not know
    ids = ours.encode(text)
    assert ids == ref(text, add_special_tokens=False)["input_ids"]
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)


def test_without_the_tokenizers_library_the_error_says_what_to_install(vocab_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # ``import tokenizers`` now raises ImportError
    with pytest.raises(
        ModelDirError, match=r"WordPiece tokenizer needs the tokenizers package: pip install 'aiayn\[hf\]'"
    ):
        load_bert_tokenizer(vocab_dir)


def test_downloaded_bert_directory_runs_with_its_wordpiece_tokenizer(vocab_dir, tmp_path):
    """[CLS] text [SEP] through aiayn's tokenizer and model = BertTokenizer + transformers."""
    for name in ("vocab.txt", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((vocab_dir / name).read_bytes())
    ref = transformers.BertTokenizer.from_pretrained(tmp_path)
    labels = dict(id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1})
    hf = hf_bert(tmp_path, transformers.BertForSequenceClassification, vocab_size=len(ref),
                 max_position_embeddings=64, initializer_range=0.5, **labels)  # fmt: skip
    ours, tok, meta = load_encoder_dir(tmp_path)
    assert meta == {"kind": "encoder", "labels": ["no", "yes"]} and isinstance(tok, WordPieceTokenizer)
    c = ours.config
    assert (c.pad_id, c.unk_id, c.bos_id, c.eos_id) == (0, 100, 101, 102)
    texts = SENTENCES[:3]
    enc = ref(texts, padding=True, return_tensors="pt")
    rows = [torch.tensor([tok.bos_id, *tok.encode(t), tok.eos_id]) for t in texts]
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=tok.pad_id)
    assert torch.equal(ids, enc["input_ids"])
    with torch.no_grad():
        assert_close("BERT + WordPiece end to end", ours.classify(ids), hf(**enc).logits, atol=1e-4)
    # and back out: aiayn export writes BERT again, with the WordPiece files
    assert main(["export", "--model", str(tmp_path), "--to", "hf", str(tmp_path / "out")]) == 0
    again = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    assert (
        transformers.BertTokenizer.from_pretrained(tmp_path / "out")(texts[0])["input_ids"]
        == enc["input_ids"][0][: len(rows[0])].tolist()
    )
    with torch.no_grad():
        assert_close("BERT imported and exported again", again(**enc).logits, hf(**enc).logits, atol=1e-4)


def copy_vocab(source, target):
    target.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.txt", "tokenizer_config.json"):
        (target / name).write_bytes((source / name).read_bytes())


def test_classify_and_fill_mask_on_a_downloaded_bert_as_transformers_does(vocab_dir, tmp_path, capsys):
    """The command line on HF directories: [CLS] = 101 and [SEP] = 102 reach the model, and the
    printed probabilities are transformers' (weights initialised wide, so that they are far from
    uniform)."""
    copy_vocab(vocab_dir, tmp_path / "clf")
    ref = transformers.BertTokenizer.from_pretrained(tmp_path / "clf")
    sizes = dict(vocab_size=len(ref), max_position_embeddings=64, initializer_range=0.5)
    hf = hf_bert(tmp_path / "clf", transformers.BertForSequenceClassification, **sizes)
    texts = SENTENCES[:3]
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    capsys.readouterr()
    args = ["classify", "--model", str(tmp_path / "clf"), "--input", str(tmp_path / "in.txt"), "--json"]
    assert main([*args, "--top-k", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    got = torch.tensor([[p for _, p in sorted(zip(r["labels"], r["probabilities"]))] for r in rows])
    with torch.no_grad():
        want = hf(**ref(texts, padding=True, return_tensors="pt")).logits.softmax(-1)
    assert (want - 0.5).abs().max() > 0.2  # far from uniform: a wrong [CLS] would show
    assert torch.allclose(got, want, atol=1e-4), (got, want)

    copy_vocab(vocab_dir, tmp_path / "mlm")
    hf = hf_bert(tmp_path / "mlm", **sizes)
    tok = load_bert_tokenizer(tmp_path / "mlm")
    assert (
        main(
            ["fill-mask", "--model", str(tmp_path / "mlm"), "--top-k", "3", "--json", "the café <mask> costs"]
        )
        == 0
    )
    fillers = json.loads(capsys.readouterr().out)[0]
    enc = ref("the café [MASK] costs", return_tensors="pt")
    with torch.no_grad():
        logits = hf(**enc).logits[0, enc["input_ids"][0].tolist().index(tok.mask_id)]
    logits[: tok.mask_id + 1] = -torch.inf  # as aiayn's MaskFiller: no specials, no [unused*]
    probs, best = logits.softmax(-1).topk(3)
    assert [f["token"] for f in fillers] == [tok.decode([j]) for j in best.tolist()]
    assert torch.allclose(torch.tensor([f["probability"] for f in fillers]), probs, atol=1e-4)
    # BERT's own [MASK], as a user of transformers writes it, is read the same
    assert (
        main(
            ["fill-mask", "--model", str(tmp_path / "mlm"), "--top-k", "3", "--json", "the café [MASK] costs"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)[0] == fillers


def test_fill_mask_never_offers_a_special_when_mask_comes_first_in_the_vocabulary(tmp_path):
    """A WordPiece vocabulary may put [MASK] first (0) and the other specials after it: they are named
    by id, not found below [MASK]'s, so none is offered, and every other piece may be."""
    trainer = tokenizers.BertWordPieceTokenizer(lowercase=True)
    firsts = ["[MASK]", "[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    trainer.train_from_iterator(CORPUS * 5, vocab_size=120, min_frequency=1, special_tokens=firsts)
    vocab = trainer.get_vocab()
    lines = "".join(t + "\n" for t in sorted(vocab, key=vocab.get))
    (tmp_path / "vocab.txt").write_text(lines, encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    hf_bert(tmp_path, vocab_size=len(vocab), max_position_embeddings=64, pad_token_id=1)
    filler = MaskFiller.from_dir(tmp_path)
    tok = filler.tokenizer
    assert (tok.mask_id, tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3, 4)
    fillers = filler.fill("the café <mask> costs", top_k=len(vocab))[0]
    assert len(fillers) == len(vocab) - len(firsts)
    assert not {f.token for f in fillers} & set(firsts)
    assert sum(f.probability for f in fillers) == pytest.approx(1.0, abs=1e-5)


# -- the command line --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentencepiece():
    return SentencePieceTokenizer.train(
        ["a good film", "a bad film", "the plot is dull"] * 50, 300, mask=True
    )


@pytest.fixture(scope="module")
def converter(sentencepiece, tmp_path_factory):
    """Skips where the installed transformers' sentencepiece converter splits unlike sentencepiece
    (5.17 does): the export writes no tokenizer.json there, and says so."""
    from aiayn.interop.bert.fast_tokenizer import save_fast_tokenizer

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if not save_fast_tokenizer(sentencepiece, tmp_path_factory.mktemp("converter"), 64):
            pytest.skip(f"transformers {transformers.__version__}: {caught[0].message if caught else ''}")


def test_export_from_the_command_line_keeps_labels_and_tokenizer(tmp_path, capsys, sentencepiece, converter):
    tok = sentencepiece
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
    # aiayn's sentencepiece files in their own folder; OUT/tokenizer.json is HF's fast tokenizer
    assert (tmp_path / "hf" / "aiayn_tokenizer" / "spm.model").is_file()
    assert json.loads((tmp_path / "hf" / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    (tmp_path / "in.txt").write_text("a good film\nthe plot is dull\nbad\n", encoding="utf-8")
    outputs = []
    for name in ("model", "hf"):  # the export classifies as the original, with aiayn's tokenizer and labels
        capsys.readouterr()
        args = [
            "classify",
            "--model",
            str(tmp_path / name),
            "--input",
            str(tmp_path / "in.txt"),
            "--top-k",
            "2",
        ]
        assert main(args) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].count("positive") == 3
    mean = EncoderModel(EncoderConfig(vocab_size=tok.vocab_size, n_classes=2, **{**BERT, "max_len": 64}))
    save_model(mean, tmp_path / "mean", labels=["negative", "positive"])
    tok.save(tmp_path / "mean")
    assert main(["export", "--model", str(tmp_path / "mean"), "--to", "hf", str(tmp_path / "hf2")]) == 1
    assert "EncoderConfig.pooling='mean', BERT needs 'first'" in capsys.readouterr().err
    assert not (tmp_path / "hf2").exists()


def test_export_keeps_how_a_classifier_reads_long_texts(tmp_path, capsys, sentencepiece):
    """A classifier trained at max_len 16 reading head+tail: its export reads a long text the same
    way (not the head over all 64 positions), and the fast tokenizer truncates at 16. The columns of
    the table it was trained on are kept too: ``aiayn evaluate`` reads the same table without them."""
    torch.manual_seed(0)
    m = EncoderModel(EncoderConfig(vocab_size=sentencepiece.vocab_size, n_classes=2, pooling="first",
                                   pooler=True, **{**BERT, "max_len": 64}))  # fmt: skip
    policy = {"how": "head+tail", "stride": 0, "max_len": 16}
    save_model(m, tmp_path / "model", labels=["negative", "positive"], long_text=policy,
               text_column="body", label_column="sentiment")  # fmt: skip
    sentencepiece.save(tmp_path / "model")
    assert main(["export", "--model", str(tmp_path / "model"), "--to", "hf", str(tmp_path / "hf")]) == 0
    kept = {"long_text": policy, "text_column": "body", "label_column": "sentiment"}
    assert {k: load_encoder_dir(tmp_path / "hf")[2][k] for k in kept} == kept
    assert {k: model_meta(tmp_path / "hf")[k] for k in kept} == kept
    # id, body, sentiment: names the defaults do not know (a "text" and a "label" column)
    rows = ["id\tbody\tsentiment", "1\ta good film\tpositive", "2\ta dull bad film\tnegative"]
    (tmp_path / "table.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    reports = []
    for name in ("model", "hf"):
        capsys.readouterr()
        assert main(["evaluate", "--model", str(tmp_path / name), "--data", str(tmp_path / "table.tsv")]) == 0
        first, rest = capsys.readouterr().out.split("\n", 1)  # the first line names the model
        assert first.startswith(f"{tmp_path / 'table.tsv'}: 2 examples")
        reports.append(rest)  # accuracy, macro-F1, confusion
    assert reports[0] == reports[1]
    text = " ".join(["a good film", "the plot is dull", "a bad film"] * 8)  # far over 16 pieces
    assert len(sentencepiece.encode(text)) > 40
    (tmp_path / "in.txt").write_text(text + "\n", encoding="utf-8")
    outputs = []
    for name in ("model", "hf"):
        capsys.readouterr()
        assert main(["classify", "--model", str(tmp_path / name), "--input", str(tmp_path / "in.txt"),
                     "--top-k", "2"]) == 0  # fmt: skip
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    head = TextClassifier(m.eval(), sentencepiece, ["negative", "positive"])  # what the export read before
    exported = TextClassifier.from_dir(tmp_path / "hf")
    assert not torch.allclose(head.probabilities([text]), exported.probabilities([text]))
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == 16
    # a classifier's export (like any BERT classifier) records no objective, and fills no masks
    with pytest.raises(ModelDirError, match="objective 'classify'"):
        MaskFiller.from_dir(tmp_path / "hf")


def test_exported_masked_lm_fills_masks_as_the_original(tmp_path, capsys, sentencepiece):
    torch.manual_seed(0)
    m = EncoderModel(EncoderConfig(vocab_size=sentencepiece.vocab_size, **{**BERT, "max_len": 64}))
    save_model(m, tmp_path / "mlm")
    sentencepiece.save(tmp_path / "mlm")
    assert main(["export", "--model", str(tmp_path / "mlm"), "--to", "hf", str(tmp_path / "hf")]) == 0
    assert transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf").config.architectures == [
        "BertForMaskedLM"
    ]
    outputs = []
    for name in ("mlm", "hf"):
        capsys.readouterr()
        assert main(["fill-mask", "--model", str(tmp_path / name), "--top-k", "3", "a good <mask> ."]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 3
    # trained at max_len 24 (a masked-LM run's trained_max_len): the export reads no row past it either
    save_model(m, tmp_path / "short", trained_max_len=24)
    sentencepiece.save(tmp_path / "short")
    assert main(["export", "--model", str(tmp_path / "short"), "--to", "hf", str(tmp_path / "hf24")]) == 0
    for name in ("short", "hf24"):
        assert MaskFiller.from_dir(tmp_path / name).max_len == 24, name
    config = json.loads((tmp_path / "hf24" / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == 24


TEXTS = [
    "a good film",
    "The plot is DULL!",
    "  two  spaces ",
    "a good <mask> film .",
    "naïve café ☃",
    "",
    "a\tgood\nfilm",
]


@pytest.mark.parametrize("lowercase", [False, True])
@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_exported_sentencepiece_vocabulary_loads_in_autotokenizer_and_encodes_as_aiayn(
    tmp_path, lowercase, model_type, converter
):
    """``AutoTokenizer.from_pretrained(export)`` reads the sentencepiece vocabulary's HF files and gives,
    for every text, ``[bos] + aiayn's ids + [eos]`` — what aiayn's batches feed the model — and
    ``BertForSequenceClassification`` on those ids the original's logits."""
    words = [
        "a",
        "good",
        "bad",
        "film",
        "plot",
        "is",
        "dull",
        "the",
        "Naïve",
        "café",
        "Two",
        "Spaces",
        "and",
        "TABS",
        "actor",
        "scene",
        "music",
        "story",
        "ending",
    ]
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(2000)]
    tok = SentencePieceTokenizer.train(lines, 300, model_type, mask=True, lowercase=lowercase)
    torch.manual_seed(0)
    m = EncoderModel(EncoderConfig(vocab_size=tok.vocab_size, n_classes=2, pooling="first", pooler=True,
                                   **{**BERT, "max_len": 64})).eval()  # fmt: skip
    export_bert(m, tmp_path / "hf", ["neg", "pos"], tok)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert auto.is_fast
    for text in TEXTS:
        assert auto(text)["input_ids"] == [1, *tok.encode(text), 2], text
    # the one known difference (fast_tokenizer.py): a text that starts with the mask
    spm = tok.encode("<mask> film")  # sentencepiece: a lone "▁" first; HF: none
    assert tok.sp.id_to_piece(spm[0]) == "\u2581" and auto("<mask> film")["input_ids"] == [1, *spm[1:], 2]
    assert auto.decode(auto("a good film")["input_ids"], skip_special_tokens=True) == tok.decode(
        tok.encode("a good film")
    )
    assert (auto.pad_token_id, auto.cls_token_id, auto.sep_token_id, auto.mask_token_id) == (
        0,
        1,
        2,
        tok.mask_id,
    )
    batch = auto(TEXTS[:3], padding=True, return_tensors="pt")
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        theirs = hf(**batch).logits
        ours = m.classify(batch["input_ids"])
    assert_close("exported sentencepiece BERT via AutoTokenizer", theirs, ours, atol=1e-4)


def test_a_converter_that_splits_unlike_sentencepiece_writes_no_tokenizer_json(
    tmp_path, monkeypatch, sentencepiece
):
    """Some transformers 5.x converters leave out the dummy prefix (the first word's "▁"): simulated by
    dropping the built tokenizer's pre-tokenizer, the export writes no tokenizer.json and warns, and
    AutoTokenizer refuses the export (it read every word as [UNK] with a vocabulary-less BertTokenizer)."""
    from transformers.convert_slow_tokenizer import SpmConverter

    build = SpmConverter.build_tokenizer_from_spm_proto

    def without_prefix(proto, vocab, merges=None):
        fast = build(proto, vocab, merges)
        fast.pre_tokenizer = None
        return fast

    monkeypatch.setattr(SpmConverter, "build_tokenizer_from_spm_proto", staticmethod(without_prefix))
    m = EncoderModel(EncoderConfig(vocab_size=sentencepiece.vocab_size, n_classes=2, pooling="first",
                                   pooler=True, **{**BERT, "max_len": 64}))  # fmt: skip
    with pytest.warns(UserWarning, match=r"no tokenizer.json written: transformers .* splits 'a film'"):
        export_bert(m, tmp_path / "hf", ["neg", "pos"], sentencepiece)
    assert not (tmp_path / "hf" / "tokenizer.json").exists()
    with pytest.raises(ValueError, match="backend tokenizer"):
        transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    exported = TextClassifier.from_dir(tmp_path / "hf")  # aiayn still reads its own tokenizer there
    assert exported.tokenizer.encode("a good film") == sentencepiece.encode("a good film")


def test_a_character_vocabulary_export_is_refused_by_auto_tokenizer_not_read_as_unknowns(tmp_path):
    """An encoder with aiayn's character tokenizer exports its own tokenizer only (aiayn_tokenizer/):
    AutoTokenizer then built a BertTokenizer of a five-token vocabulary, every word [UNK]; now it fails."""
    from aiayn.data import CharTokenizer

    tok = CharTokenizer.train(["a good film", "a bad film"])
    m = EncoderModel(EncoderConfig(vocab_size=tok.vocab_size, n_classes=2, pooling="first", pooler=True,
                                   **{**BERT, "max_len": 64}))  # fmt: skip
    export_bert(m, tmp_path / "hf", ["neg", "pos"], tok)
    with pytest.raises(ValueError, match="backend tokenizer"):
        transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")


def test_an_export_into_a_directory_with_files_is_refused_not_mixed(tmp_path):
    """A second export into the same directory kept the first one's files (a tokenizer.json that
    AutoTokenizer then read for a model it does not fit): a directory with files is refused, and what
    is there stays as it was."""
    m = model(**CLASSIFIER)
    export_hf(m, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    with pytest.raises(ModelDirError, match="is not an empty directory: an earlier export's files"):
        export_bert(m, tmp_path / "out", ["neg", "neutral", "pos"])
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    (tmp_path / "empty").mkdir()
    assert (export_hf(m, tmp_path / "empty") / "config.json").is_file()
