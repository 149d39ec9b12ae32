"""Encoder/decoder layers and stacks against nn.TransformerEncoderLayer, ...DecoderLayer, nn.Transformer."""

import pytest
import torch
from torch import nn

from aiayn.masks import causal_mask, padding_mask, window_mask
from aiayn.modules import Decoder, DecoderContext, DecoderLayer, Encoder, EncoderLayer
from aiayn.modules import dropout as dropout_module
from aiayn.modules.config import LayerConfig
from tests.helpers import assert_close, copy_decoder_layer, copy_encoder_layer, copy_layer_norm, copy_mha

D, H, FF = 32, 4, 64


def _cfg(norm_first: bool, **kw) -> LayerConfig:
    return LayerConfig(d_model=D, n_heads=H, d_ff=FF, dropout=0.0, norm_first=norm_first, **kw)


def _ref_kwargs(norm_first: bool) -> dict:
    # train() mode with dropout 0: keeps nn's inference fast path (nested tensors) out of the way
    return dict(dim_feedforward=FF, dropout=0.0, batch_first=True, norm_first=norm_first)


def _batch():
    src_ids = torch.tensor([[7] * 9, [7] * 6 + [0] * 3, [7] * 2 + [0] * 7])
    tgt_ids = torch.tensor([[7] * 5, [7] * 3 + [0] * 2, [7] * 5])
    return torch.randn(3, 9, D), src_ids, torch.randn(3, 5, D), tgt_ids


@pytest.mark.parametrize("window", [0, 2], ids=["full", "window 2"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_layer_matches_nn(norm_first, window):
    """With ``window``: ``attn_window``'s band mask, combined with padding, reads as nn's attn_mask
    (True = blocked)."""
    ref = nn.TransformerEncoderLayer(D, H, **_ref_kwargs(norm_first))
    ours = EncoderLayer(_cfg(norm_first))
    copy_encoder_layer(ours, ref)
    x, src_ids, _, _ = _batch()
    mask, band = padding_mask(src_ids, 0), None
    if window:
        src_ids[2, :5] = 7  # every real query has a real key within the window
        mask, band = padding_mask(src_ids, 0) & window_mask(9, window), ~window_mask(9, window)
    out, _ = ours(x, mask)
    ref_out = ref(x, src_mask=band, src_key_padding_mask=src_ids == 0)
    real = src_ids != 0
    kind = f"{'pre' if norm_first else 'post'}-norm{', window' if window else ''}"
    name = f"EncoderLayer({kind}) vs nn.TransformerEncoderLayer"
    if window:  # a pad query with no key in its band: zeros here, NaN in nn; real positions compared
        assert_close(name, out[real], ref_out[real])
    else:
        assert_close(name, out, ref_out)
    if window:  # the window took effect
        assert not torch.allclose(out[real], ours(x, padding_mask(src_ids, 0))[0][real], atol=1e-3)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_decoder_layer_matches_nn(norm_first):
    ref = nn.TransformerDecoderLayer(D, H, **_ref_kwargs(norm_first))
    ours = DecoderLayer(_cfg(norm_first))
    copy_decoder_layer(ours, ref)
    memory, src_ids, y, tgt_ids = _batch()
    out, _ = ours(
        y, DecoderContext(memory, padding_mask(src_ids, 0)), padding_mask(tgt_ids, 0) & causal_mask(5)
    )
    ref_out = ref(
        y, memory, tgt_mask=~causal_mask(5), tgt_key_padding_mask=tgt_ids == 0,
        memory_key_padding_mask=src_ids == 0,
    )  # fmt: skip
    name = f"DecoderLayer({'pre' if norm_first else 'post'}-norm) vs nn.TransformerDecoderLayer"
    assert_close(name, out, ref_out)


class _Half(nn.Module):
    """A dropout whose every mask is 0.5: deterministic, and visible wherever it is applied."""

    def forward(self, x):
        return 0.5 * x


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_residual_and_feed_forward_dropout_sit_where_torch_nn_puts_them(norm_first, monkeypatch):
    """§5.4: dropout on each sublayer's output before it is added to the residual stream (and, with
    ``ff_dropout``, after the feed-forward's activation). In training mode every mask is made a constant
    0.5, ours through the mask function, nn's by replacing its dropout modules, so a dropout moved onto
    the residual stream, or one missing, would differ."""
    monkeypatch.setattr(dropout_module, "_scaled_mask", lambda x, p: torch.full_like(x, 0.5))
    ref = nn.TransformerDecoderLayer(D, H, **_ref_kwargs(norm_first))
    for name in ("dropout1", "dropout2", "dropout3", "dropout"):  # the three sublayers', the FF's inner
        setattr(ref, name, _Half())
    cfg = LayerConfig(d_model=D, n_heads=H, d_ff=FF, dropout=0.1, ff_dropout=0.1, norm_first=norm_first)
    ours = DecoderLayer(cfg).train()
    copy_decoder_layer(ours, ref)
    memory, src_ids, y, _ = _batch()
    out, _ = ours(y, DecoderContext(memory, padding_mask(src_ids, 0)), causal_mask(5))
    ref_out = ref(y, memory, tgt_mask=~causal_mask(5).reshape(5, 5), memory_key_padding_mask=src_ids == 0)
    assert_close("DecoderLayer dropout placement vs nn.TransformerDecoderLayer", out, ref_out)


# nn.Transformer cannot be told enable_nested_tensor=False, and warns that a pre-norm stack cannot use nested
# tensors (a fast path for inference with padding, not what this test compares)
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True:UserWarning")
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_decoder_stack_matches_nn_transformer(norm_first):
    n = 3
    ref = nn.Transformer(D, H, n, n, **_ref_kwargs(norm_first))
    if not norm_first:
        # nn.Transformer always adds a final LayerNorm; the paper's post-norm stack has none
        ref.encoder.norm = None
        ref.decoder.norm = None
    enc, dec = Encoder(_cfg(norm_first), n), Decoder(_cfg(norm_first), n)
    for ours, theirs in zip(enc.layers, ref.encoder.layers):
        copy_encoder_layer(ours, theirs)
    for ours, theirs in zip(dec.layers, ref.decoder.layers):
        copy_decoder_layer(ours, theirs)
    if norm_first:
        copy_layer_norm(enc.norm, ref.encoder.norm)
        copy_layer_norm(dec.norm, ref.decoder.norm)
    x, src_ids, y, _ = _batch()
    src_mask = padding_mask(src_ids, 0)
    memory, _ = enc(x, src_mask)
    out, _ = dec(y, DecoderContext(memory, src_mask), causal_mask(5))
    ref_out = ref(x, y, tgt_mask=~causal_mask(5), src_key_padding_mask=src_ids == 0,
                  memory_key_padding_mask=src_ids == 0)  # fmt: skip
    name = f"Encoder+Decoder({'pre' if norm_first else 'post'}-norm) vs nn.Transformer"
    assert_close(name, out, ref_out)


def test_stack_layers_are_independent_not_shallow_copies():
    """Tutorial pitfall: [layer] * N (or a shallow copy) makes N references to one set of weights."""
    enc = Encoder(_cfg(False), 4)
    ptrs = [layer.self_attn.w_qkv.weight.data_ptr() for layer in enc.layers]
    assert len(set(ptrs)) == 4
    per_layer = sum(p.numel() for p in enc.layers[0].parameters())
    assert sum(p.numel() for p in enc.parameters()) == 4 * per_layer
    with torch.no_grad():
        enc.layers[0].ff.w_1.weight.zero_()
    assert enc.layers[1].ff.w_1.weight.abs().sum() > 0


def test_pre_norm_stack_has_final_norm_and_post_norm_does_not():
    assert Encoder(_cfg(True), 2).norm is not None and Decoder(_cfg(True), 2).norm is not None
    assert Encoder(_cfg(False), 2).norm is None and Decoder(_cfg(False), 2).norm is None


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_right_to_left_sublayer_matches_a_chain_of_torch_nn_parts(norm_first):
    """The fourth sublayer (after cross-attention, before the feed-forward) against torch.nn's own
    parts chained by hand: nn.TransformerDecoderLayer's three sublayers with one more
    nn.MultiheadAttention + nn.LayerNorm over the right-to-left memory, every bias and gain random."""
    ref = nn.TransformerDecoderLayer(D, H, **_ref_kwargs(norm_first))
    ref_r2l, ref_norm = nn.MultiheadAttention(D, H, batch_first=True), nn.LayerNorm(D)
    ours = DecoderLayer(_cfg(norm_first), r2l=True)
    copy_decoder_layer(ours, ref)
    copy_mha(ours.cross_attn_r2l, ref_r2l)
    copy_layer_norm(ours.cross_attn_r2l_res.norm, ref_norm)
    y, memory, r2l = torch.randn(2, 4, D), torch.randn(2, 6, D), torch.randn(2, 5, D)
    r2l_ids = torch.tensor([[7] * 5, [7] * 3 + [0] * 2])
    out, _ = ours(
        y, DecoderContext(memory, r2l_memory=r2l, r2l_mask=padding_mask(r2l_ids, 0)), causal_mask(4)
    )

    def sublayer(x, norm, f):  # x + f(LN(x)) (pre-norm) or LN(x + f(x)) (post-norm, the paper's)
        return x + f(norm(x)) if norm_first else norm(x + f(x))

    look_ahead = ~causal_mask(4).reshape(4, 4)  # nn: True = blocked
    x = sublayer(y, ref.norm1, lambda h: ref.self_attn(h, h, h, attn_mask=look_ahead)[0])
    x = sublayer(x, ref.norm2, lambda h: ref.multihead_attn(h, memory, memory)[0])
    x = sublayer(x, ref_norm, lambda h: ref_r2l(h, r2l, r2l, key_padding_mask=r2l_ids == 0)[0])
    x = sublayer(x, ref.norm3, lambda h: ref.linear2(ref.activation(ref.linear1(h))))
    assert_close("DecoderLayer(r2l=True) vs torch.nn parts chained by hand", out, x)


def test_right_to_left_memory_is_attended():
    layer = DecoderLayer(_cfg(False), r2l=True).eval()
    y, memory, r2l = torch.randn(2, 4, D), torch.randn(2, 6, D), torch.randn(2, 5, D)
    out, w = layer(y, DecoderContext(memory, r2l_memory=r2l), causal_mask(4), need_weights=True)
    assert out.shape == (2, 4, D) and w["cross_r2l"].shape == (2, H, 4, 5)
    out2, _ = layer(y, DecoderContext(memory, r2l_memory=r2l + 1.0), causal_mask(4))
    assert (out - out2).abs().max() > 1e-4  # the second memory changes the output
    with pytest.raises(ValueError, match="pass r2l_memory"):
        layer(y, DecoderContext(memory))
