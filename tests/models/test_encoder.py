"""The encoder-only model's objectives against torch's own functions: masked-LM loss only at the
chosen positions, classification cross-entropy (weighted), pooling, and BERT's extra layers."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn import EncoderConfig, EncoderModel, LanguageModel, LMConfig
from aiayn.data.batching import ClassifyBatch, LMBatch, MaskedBatch
from aiayn.data.replacing import DetectionBatch
from aiayn.errors import ConfigError
from aiayn.training.criteria import (
    causal_encoder_loss,
    classification_loss,
    masked_lm_loss,
    replaced_token_loss,
)
from tests.helpers import assert_close

SMALL = dict(d_model=32, n_heads=4, d_ff=64, dropout=0.0)
BERT = dict(embed_norm=True, head_transform=True, pooling="first", pooler=True, output_bias=True,
            positional="learned", activation="gelu", emb_scale="none")  # fmt: skip


def model(**kw) -> EncoderModel:
    torch.manual_seed(0)
    return EncoderModel(EncoderConfig(vocab_size=50, n_layers=2, **{**SMALL, **kw})).eval()


def padded_batch():
    ids = torch.randint(5, 50, (3, 9))
    ids[:, 0] = 1
    ids[1, 6:], ids[1, 5] = 0, 2
    ids[2, 4:], ids[2, 3] = 0, 2
    return ids


def test_bias_false_leaves_no_bias_but_the_asked_for_output_bias():
    """``bias=False`` (biases in linear layers and LayerNorm) reaches every part: the embedding's
    LayerNorm, BERT's head transform and pooler, the classifier, ELECTRA's detector."""
    m = model(**BERT, bias=False, n_classes=3, detector=True)
    biases = [name for name, _ in m.named_parameters() if name.endswith("bias")]
    assert biases == ["head.bias"]  # output_bias=True: asked for by name
    assert m.classify(padded_batch()).shape == (3, 3)


@pytest.mark.parametrize("kw", [{}, BERT, dict(tie_output=False)])
def test_mlm_loss_is_cross_entropy_at_chosen_positions_only(kw):
    m, ids = model(**kw), padded_batch()
    targets = torch.zeros_like(ids)
    targets[0, 2], targets[0, 5], targets[1, 3] = 7, 9, 11
    with torch.no_grad():
        loss, nll, n = masked_lm_loss(m, MaskedBatch(ids, targets), 0.1)
        logits = m(ids)  # (B, T, V)
    chosen = targets != 0
    ref = F.cross_entropy(logits[chosen], targets[chosen], reduction="sum", label_smoothing=0.1)
    ref_nll = F.cross_entropy(logits[chosen], targets[chosen], reduction="sum")
    assert int(n) == 3
    assert_close("EncoderModel MLM loss", loss, ref, atol=1e-4)
    assert_close("EncoderModel MLM nll", nll, ref_nll, atol=1e-4)


def test_mlm_gradient_reaches_only_through_chosen_positions():
    m = model()
    m.train()
    ids = padded_batch()
    targets = torch.zeros_like(ids)
    targets[0, 2] = 7
    states, encode = {}, m.encode

    def keep_states(x):
        out = encode(x)
        out[0].retain_grad()
        states["h"] = out[0]  # (B, T, d_model): the encoder's output, before the vocabulary head
        return out

    m.encode = keep_states
    masked_lm_loss(m, MaskedBatch(ids, targets), 0.0).loss.backward()
    reached = states["h"].grad.abs().sum(-1) > 0  # (B, T)
    assert reached[0, 2] and int(reached.sum()) == 1  # the chosen position's state only


@pytest.mark.parametrize("pooling", ["mean", "first", "max"])
def test_classification_loss_and_weights(pooling):
    m, ids = model(n_classes=3, pooling=pooling), padded_batch()
    labels = torch.tensor([0, 2, 1])
    weight = torch.tensor([0.5, 1.0, 2.0])
    with torch.no_grad():
        logits = m.classify(ids)
        loss, nll, n = classification_loss(m, ClassifyBatch(ids, labels), 0.1, weight)
    # each text's smoothed loss weighed by its own class (F.cross_entropy's weight would weigh the
    # smoothing term of every class by that class's weight)
    ref = (weight[labels] * F.cross_entropy(logits, labels, reduction="none", label_smoothing=0.1)).sum()
    assert_close("EncoderModel classify loss", loss, ref, atol=1e-5)
    with torch.no_grad():  # without smoothing: torch's weighted cross-entropy
        plain = classification_loss(m, ClassifyBatch(ids, labels), 0.0, weight)[0]
    torch_weighted = F.cross_entropy(logits, labels, weight, reduction="sum")
    assert_close("classify loss, ε = 0", plain, torch_weighted, atol=1e-5)
    assert_close(
        "EncoderModel classify nll", nll, F.cross_entropy(logits, labels, reduction="sum"), atol=1e-5
    )
    assert int(n) == 3


def test_first_token_pooling_reads_position_zero():
    m, ids = model(n_classes=2, pooling="first", pooler=True), padded_batch()
    with torch.no_grad():
        states = m.encode(ids)[0]
        c = m.classifier
        ref = c.out(torch.tanh(c.pooler(states[:, 0])))
        assert_close("first-token pooling + tanh pooler", m.classify(ids), ref)


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_mean_and_max_pooling_read_only_the_real_tokens(pooling):
    """Row by row, the pooled vector is the mean or each feature's max over the row's unpadded
    states (Kim 2014's max-over-time pooling); over all positions it would differ."""
    m, ids = model(n_classes=2, pooling=pooling), padded_batch()
    reduce = (lambda x: x.mean(0)) if pooling == "mean" else (lambda x: x.amax(0))
    with torch.no_grad():
        states = m.encode(ids)[0]  # (B, T, d_model)
        pooled = m.pool(ids, states)
        for b, n in enumerate((ids != 0).sum(1).tolist()):
            assert_close(f"{pooling} pooling, row {b}", pooled[b], reduce(states[b, :n]))
        assert not torch.allclose(pooled[1:], reduce(states[1:].transpose(0, 1)))  # padding would count
        assert_close(f"{pooling} pooling → classifier", m.classify(ids), m.classifier.out(pooled))


def test_bert_layers_match_torch_layer_norm():
    m, ids = model(**BERT), padded_batch()
    ref_norm = nn.LayerNorm(32, eps=1e-5)
    with torch.no_grad():
        ref_norm.weight.copy_(torch.randn(32))
        ref_norm.bias.copy_(torch.randn(32))
        m.embed.norm.weight.copy_(ref_norm.weight)
        m.embed.norm.bias.copy_(ref_norm.bias)
        e = m.embed
        summed = e.positions(e.tokens(ids))  # token + learned position, unnormalised
        assert_close("BERT embedding LayerNorm", m.embed(ids), ref_norm(summed))
        h = torch.randn(4, 32)
        t = m.transform
        ref = F.layer_norm(F.gelu(t.dense(h)), (32,), t.norm.weight, t.norm.bias, 1e-5)
        assert_close("BERT head transform", t(h), ref)


def test_the_detector_is_electras_discriminator_head():
    """ELECTRA = BERT's encoder + a per-token head; with BERT's fields and ``detector`` the model is
    transformers' ``ElectraForPreTraining`` (random weights copied through the BERT export's names)."""
    transformers = pytest.importorskip("transformers")
    from aiayn.interop.bert.convert import TOKEN_TYPES, name_map

    torch.manual_seed(0)
    bert = dict(embed_norm=True, head_transform=True, output_bias=True, positional="learned",
                activation="gelu", emb_scale="none", ln_eps=1e-12, d_model=32, n_heads=4, d_ff=64,
                n_layers=2, max_len=40, dropout=0.0)  # fmt: skip
    ours = EncoderModel(EncoderConfig(vocab_size=60, detector=True, **bert)).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    hf_config = transformers.ElectraConfig(
        vocab_size=60,
        embedding_size=32,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-12,
        pad_token_id=0,
    )
    theirs = transformers.ElectraForPreTraining(hf_config).eval()
    state = ours.state_dict()
    tensors = {k.replace("bert.", "electra.", 1): v for k, v in name_map(ours.config).to_hf(state).items()
               if k.startswith("bert.")}  # fmt: skip
    tensors[TOKEN_TYPES.replace("bert.", "electra.", 1)] = torch.zeros(2, 32)
    for a, b in (("dense", "dense"), ("out", "dense_prediction")):
        for p in ("weight", "bias"):
            tensors[f"discriminator_predictions.{b}.{p}"] = state[f"detector.{a}.{p}"]
    missing, unexpected = theirs.load_state_dict(tensors, strict=False)
    assert not unexpected and all("position_ids" in k or "token_type_ids" in k for k in missing)
    ids = torch.randint(5, 60, (3, 9))
    ids[:, 0], ids[1, 6:], ids[1, 5] = 1, 0, 2
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=(ids != 0).long()).logits
        got = ours.detect(ids)
    real = ids != 0
    assert_close("EncoderModel detector vs ElectraForPreTraining", got[real], expected[real], atol=1e-5)
    with pytest.raises(ValueError, match="no replaced-token detection head"):
        EncoderModel(EncoderConfig(vocab_size=60, **bert)).detect(ids)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_replaced_token_loss_is_binary_cross_entropy_at_the_scored_positions(epsilon):
    m = model(detector=True)
    ids = torch.randint(5, 50, (3, 8))
    labels = torch.randint(0, 2, (3, 8))
    labels[:, 0] = labels[0, -2:] = -1  # bos, padding: not scored
    loss, nll, n = replaced_token_loss(m, DetectionBatch(ids, labels), epsilon)
    logits, y = m.detect(ids), labels.float()
    scored = labels >= 0
    per_token = F.binary_cross_entropy_with_logits(logits, y * (1 - epsilon) + epsilon / 2, reduction="none")
    assert int(n) == int(scored.sum()) == 19
    assert_close("EncoderModel RTD loss", loss, per_token[scored].sum(), atol=1e-4)
    ref_nll = F.binary_cross_entropy_with_logits(logits, y, reduction="none")[scored].sum()
    assert_close("EncoderModel RTD nll", nll, ref_nll, atol=1e-4)
    loss.backward()
    assert m.detector.out.weight.grad is not None


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_causal_encoder_is_the_language_model_with_the_same_weights(norm_first):
    """``causal=True``: each position sees itself and earlier ones only, so its states equal aiayn's
    GPT-style ``LanguageModel`` (the same layers under the look-ahead mask, itself checked against
    HF GPT-2 in tests/interop) with the same weights, and a later token changes no earlier state."""
    m = model(causal=True, norm_first=norm_first)
    lm = LanguageModel(LMConfig(vocab_size=50, n_layers=2, norm_first=norm_first, **SMALL)).eval()
    state = {k.replace("encoder.", "layers.", 1): v for k, v in m.state_dict().items()}
    lm.load_state_dict(state)
    ids = torch.randint(5, 50, (2, 9))
    with torch.no_grad():
        assert_close("causal EncoderModel vs LanguageModel", m(ids), lm(ids), atol=1e-5)
        changed = ids.clone()
        changed[:, 6] = 4
        assert_close("causal EncoderModel prefix", m(changed)[:, :6], m(ids)[:, :6], atol=1e-6)
        assert not torch.allclose(m(changed)[:, 6:], m(ids)[:, 6:])
        both_ways = model(causal=False, norm_first=norm_first)  # same seed, same weights
        assert not torch.allclose(both_ways(ids)[:, :6], m(ids)[:, :6])


def test_a_local_window_bounds_what_each_state_reads():
    """``attn_window=w``: after two layers a state reads 2·w positions each way and no further; a
    window as long as the text is full attention; a bad value is refused naming the field."""
    m = model(attn_window=1)
    ids = torch.randint(5, 50, (2, 9))
    changed = ids.clone()
    changed[:, 6] = 4
    with torch.no_grad():
        before, after = m.encode(ids)[0], m.encode(changed)[0]
        assert_close("windowed states beyond reach", after[:, :4], before[:, :4], atol=1e-6)
        assert not torch.allclose(after[:, 4], before[:, 4])  # two positions away: within reach
        full = model()(ids)
        assert_close("window ≥ text length is full attention", model(attn_window=8)(ids), full, atol=1e-6)
        # padding far beyond a short text leaves pad queries with no key in reach: zeros, not NaN
        short = torch.cat([ids[:, :3], torch.zeros(2, 12, dtype=torch.long)], dim=1)
        assert_close(
            "a short text's states beside long padding",
            m.encode(short)[0][:, :3],
            m.encode(ids[:, :3])[0],
            atol=1e-5,
        )
        assert torch.isfinite(m(short)).all()
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match=r"attn_window=.* must be an integer ≥ 0"):
            EncoderConfig(vocab_size=50, attn_window=bad)
    with pytest.raises(ConfigError, match=r"pooling='first' .* sees only the first 4 positions after it"):
        EncoderConfig(vocab_size=50, n_layers=2, attn_window=2, n_classes=2, pooling="first")
    # a window whose layers reach every position a text can have is no restriction: allowed
    EncoderConfig(vocab_size=50, n_layers=2, attn_window=4, n_classes=2, pooling="first", max_len=9)
    with pytest.raises(ConfigError, match=r"sees only the first 8 positions"):
        EncoderConfig(vocab_size=50, n_layers=2, attn_window=4, n_classes=2, pooling="first", max_len=10)


def test_a_causal_classifier_cannot_pool_its_first_token():
    """Under the look-ahead mask the first token sees only itself: its state is the same for every text."""
    with pytest.raises(ConfigError, match=r"pooling='first' reads the first token, which in a causal"):
        EncoderConfig(vocab_size=50, causal=True, n_classes=2, pooling="first")
    EncoderConfig(vocab_size=50, causal=True, n_classes=2)  # the mean pools every prefix
    EncoderConfig(vocab_size=50, causal=True, pooling="first")  # no classifier: nothing pools


def test_causal_encoder_loss_is_next_token_cross_entropy_without_padding():
    m, ids = model(causal=True), padded_batch()
    inputs, targets = ids[:, :-1], ids[:, 1:]
    with torch.no_grad():
        loss, nll, n = causal_encoder_loss(m, LMBatch(inputs, targets), 0.1)
        logits = m(inputs)  # (B, T - 1, V)
    real = targets != 0
    ref = F.cross_entropy(logits[real], targets[real], reduction="sum", label_smoothing=0.1)
    assert int(n) == int(real.sum()) == 8 + 5 + 3
    assert_close("causal encoder loss", loss, ref, atol=1e-4)
    assert_close("causal encoder nll", nll, F.cross_entropy(logits[real], targets[real], reduction="sum"),
                 atol=1e-4)  # fmt: skip


def test_max_pooling_of_a_row_without_a_real_token_is_zero_as_mean_pooling():
    m = model(n_classes=2, pooling="max")
    ids = torch.tensor([[1, 5, 6], [0, 0, 0]])
    with torch.no_grad():
        pooled = m.pool(ids, m.encode(ids)[0])
    assert torch.isfinite(m.classify(ids)).all() and (pooled[1] == 0).all()
