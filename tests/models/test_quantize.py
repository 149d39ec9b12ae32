"""Dynamic int8 quantization: every Linear becomes torch's quantized Linear, the split of the stacked
attention projection changes nothing, and int8 outputs stay close to float32 for all three models.
bfloat16: every weight and buffer in bfloat16, outputs within bfloat16's precision of float32's, and a
warning where this device's bfloat16 products are slower than float32's."""

import copy
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from aiayn import EncoderConfig, EncoderModel
from aiayn import device as device_module
from aiayn.device import cpu_flags
from aiayn.errors import ConfigError
from aiayn.models import quantize as quantize_module
from aiayn.models.quantize import (
    Int8Linear,
    exact_8_bit_inputs,
    int8_qconfig,
    is_quantized,
    quantize,
    split_sliced_weights,
)
from aiayn.modules.attention import MultiHeadAttention
from tests.decoding.fixtures import tiny_lm, tiny_transformer
from tests.helpers import assert_close, randomise_

QUANTIZED_LINEAR = torch.ao.nn.quantized.dynamic.Linear


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 50, (3, 9), generator=g), torch.randint(4, 50, (3, 7), generator=g)
    src[1, 6:], tgt[2, 5:] = 0, 0  # padding
    tgt[:, 0] = 1
    return src, tgt


def _models() -> dict[str, tuple[nn.Module, tuple]]:
    src, tgt = _inputs()
    torch.manual_seed(0)
    encoder = EncoderModel(EncoderConfig(vocab_size=50, n_layers=2, d_model=32, n_heads=4, d_ff=64)).eval()
    # random biases and norm gains (init_weights zeroes biases): a bias sliced wrongly would show
    return {
        "transformer": (randomise_(tiny_transformer(50)), (src, tgt)),
        "transformer-pre-norm": (randomise_(tiny_transformer(50, norm_first=True)), (src, tgt)),
        "lm": (randomise_(tiny_lm(50)), (tgt,)),
        "encoder": (randomise_(encoder), (src,)),
    }


def _relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).norm() / ref.norm()).item()


def test_split_row_blocks_changes_no_output_and_keeps_only_the_blocks_read():
    """Cross-attention split into W^Q's and [W^K; W^V]'s rows (the whole ``w_qkv`` dropped) computes
    what it did; the blocks it never applies are not kept (an int8 model would carry them)."""
    model, inputs = _models()["transformer"]
    with torch.no_grad():
        before = model(*inputs)
        split_sliced_weights(model)
        after = model(*inputs)
    assert_close("row blocks (transformer)", after, before, atol=1e-5)
    for path, m in model.named_modules():
        if isinstance(m, MultiHeadAttention):
            split = not path.endswith("self_attn")
            assert (m.w_qkv is None) == split and (split == (m.row_blocks is not None)), path
            assert not split or list(m.row_blocks) == ["q", "kv"]
    cross = model.decoder.layers[0].cross_attn
    x, k, v = (torch.randn(2, 3, cross.row_blocks["q"].in_features) for _ in range(3))
    with pytest.raises(RuntimeError, match="no 'k' block"):  # keys and values from two tensors
        cross(x, k, v)


@pytest.mark.parametrize("name", list(_models()))
def test_int8_quantizes_every_linear_and_stays_close_to_float32(name):
    model, inputs = _models()[name]
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    attention = [p for p, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    n_cross = sum(not p.endswith("self_attn") for p in attention)
    q = quantize(copy.deepcopy(model), "int8")
    assert is_quantized(q) and not is_quantized(model)
    assert not any(type(m) is nn.Linear for m in q.modules())  # nothing left in float32
    n_cross = sum(
        isinstance(m, MultiHeadAttention) and not p.endswith("self_attn") for p, m in model.named_modules()
    )
    # each cross-attention's w_qkv (one Linear) becomes two row blocks: W^Q's and [W^K; W^V]'s
    assert sum(isinstance(m, QUANTIZED_LINEAR) for m in q.modules()) == n_linear + n_cross
    with torch.no_grad():
        ref, ours = model(*inputs), q(*inputs)
    # int8 weights (per output row) and activations (per tensor): about 2% here
    assert _relative_error(ours, ref) < 0.05
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_int8_weights_take_7_bits_where_8_would_not_be_exact_and_inputs_always_8(monkeypatch):
    for exact, widest in ((True, 128), (False, 64)):
        monkeypatch.setattr(quantize_module, "exact_8_bit_inputs", lambda e=exact: e)
        q = quantize(tiny_transformer(50), "int8")
        linears = [m for m in q.modules() if isinstance(m, Int8Linear)]
        assert {m.reduce_range for m in linears} == {False}  # 8-bit inputs
        # each row's largest weight is at the edge of its range: -128..127, or -64..63
        weights = [m.dynamic.weight().int_repr() for m in linears]
        assert max(w.abs().max().item() for w in weights) >= widest - 1
        assert min(w.min().item() for w in weights) >= -widest
        assert max(w.max().item() for w in weights) < widest
    with pytest.raises(ConfigError, match="7 or 8 bits"):
        int8_qconfig(6)
    q = quantize(tiny_transformer(50), "int8")
    n = sum(isinstance(m, Int8Linear) for m in q.modules())
    assert quantize(q, "int8") is q and sum(isinstance(m, Int8Linear) for m in q.modules()) == n  # no-op


X86_AVX2 = platform.machine() in ("x86_64", "AMD64") and "avx2" in cpu_flags()
FORCED = "FBGEMM_ENABLE_INSTRUCTIONS" in os.environ


@pytest.mark.skipif(not X86_AVX2 or FORCED, reason="fbgemm's kernels are chosen by the x86 flags")
def test_8_bit_inputs_are_exact_where_fbgemm_runs_avx512_vnni_kernels():
    """fbgemm has VNNI kernels for AVX512_VNNI only: an AVX-VNNI CPU (flag ``avx_vnni``) runs its
    AVX2 kernels, whose 16-bit pair sums overflow."""
    assert exact_8_bit_inputs() == ("avx512_vnni" in cpu_flags())


def extreme_outputs() -> tuple[float, float]:
    """``quantize``'s int8 output for the product whose 16-bit pair sums overflow: every input at
    255, every weight at ±127; ±255 in float32, about ±129 where the sums saturate."""
    extreme = nn.Linear(256, 2, bias=False)
    with torch.no_grad():
        extreme.weight[0], extreme.weight[1] = 1.0, -1.0
        x = torch.ones(3, 256)
        x[:, 0] = 0.0  # the range starts at 0: the other inputs quantize to 255
        out = quantize(nn.Sequential(extreme), "int8")(x)
    return out[0, 0].item(), out[0, 1].item()


EXTREME = """from tests.models.test_quantize import exact_8_bit_inputs, extreme_outputs, scaled_rows_error
print(exact_8_bit_inputs(), *(round(v) for v in extreme_outputs()), scaled_rows_error())"""
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not X86_AVX2, reason="FBGEMM_ENABLE_INSTRUCTIONS=AVX2 needs an x86 CPU with AVX2")
def test_int8_stays_exact_when_fbgemm_is_made_to_run_its_avx2_kernels():
    """On a VNNI CPU with fbgemm forced to AVX2 (as on an AVX-VNNI laptop), 8-bit inputs and weights
    would saturate (129 for 255): the probe sees it and ``quantize`` gives the weights 7 bits, so the
    extreme product is exact and a batch of rows of different scales keeps its inputs' 8 bits: under 2%
    error, which torch.ao's 7-bit inputs exceed and 8-bit weights with 8-bit inputs (overflowing) far
    exceed (docs/inference.md, "int8")."""
    env = {**os.environ, "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    done = subprocess.run([sys.executable, "-c", EXTREME], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    exact, first, second, error = done.stdout.split()
    assert exact == "False" and int(first) > 250 and int(second) < -250  # 255 in float32
    assert float(error) < 0.02


def scaled_rows(seed: int = 0) -> tuple[nn.Linear, torch.Tensor]:
    """A Linear and a batch of rows of different scales, as a batch of decoder states has."""
    torch.manual_seed(seed)
    return nn.Linear(512, 1024), torch.randn(64, 512) * torch.rand(64, 1) * 3


def scaled_rows_error() -> float:
    """``quantize``'s int8 error on ``scaled_rows`` against float32 (a reference nobody here wrote)."""
    linear, x = scaled_rows()
    with torch.no_grad():
        return _relative_error(quantize(nn.Sequential(copy.deepcopy(linear)), "int8")(x), linear(x))


@pytest.mark.skipif(not exact_8_bit_inputs(), reason="8-bit inputs are exact only with AVX512_VNNI")
def test_8_bit_inputs_halve_the_error_of_7_bit_ones_with_vnni():
    """Against float32: the full range's rounding step is half the reduced range's, and nothing
    overflows (an overflow would give a large error, not a smaller one)."""
    linear, x = scaled_rows()
    dynamic = quantize(nn.Sequential(copy.deepcopy(linear)), "int8")[0].dynamic
    with torch.no_grad():
        ref = linear(x)
        errors = {r: _relative_error(Int8Linear(dynamic, r)(x), ref) for r in (True, False)}
    assert errors[False] < 0.7 * errors[True] and errors[False] < 0.02
    assert scaled_rows_error() == errors[False]
    first, second = extreme_outputs()  # the case 16-bit pair sums would overflow
    assert first > 250 and second < -250  # 255 in float32; an overflow would saturate far lower


def test_a_wrong_block_would_be_caught():
    """The closeness bound above is tight enough to see a mis-wired cross-attention block."""
    model, inputs = _models()["transformer"]
    q = quantize(copy.deepcopy(model), "int8")
    first, second = (layer.cross_attn.row_blocks for layer in q.decoder.layers)
    first["kv"], second["kv"] = second["kv"], first["kv"]  # each layer reads the other's keys and values
    with torch.no_grad():
        assert _relative_error(q(*inputs), model(*inputs)) > 0.1


def test_none_is_a_no_op_and_unknown_names_are_refused():
    model = tiny_transformer(50)
    assert quantize(model, "none") is model and not is_quantized(model)
    with pytest.raises(ConfigError, match="int4"):
        quantize(model, "int4")


def test_int8_output_layer_keeps_to_its_pieces():
    src, tgt = _inputs()
    model = tiny_transformer(50, output_pieces=30)
    model.head.set_pieces(torch.arange(3, 33))
    q = quantize(copy.deepcopy(model), "int8")
    assert isinstance(q.head.piece_proj, Int8Linear) and isinstance(
        q.head.piece_proj.dynamic, QUANTIZED_LINEAR
    )
    with torch.no_grad():
        ref, ours = model(src, tgt), q(src, tgt)
    assert torch.equal(torch.isneginf(ours), torch.isneginf(ref))
    assert torch.isneginf(ref).sum() == 20 * src.size(0) * tgt.size(1)
    assert _relative_error(ours[..., 3:33], ref[..., 3:33]) < 0.05


@pytest.mark.parametrize("name", list(_models()))
def test_bf16_casts_every_weight_and_buffer_and_stays_close_to_float32(name, monkeypatch, capsys):
    monkeypatch.setattr(quantize_module, "bf16_speedup", lambda *a: 2.0)
    model, inputs = _models()[name]
    q = quantize(copy.deepcopy(model), "bf16")
    floating = [t for t in (*q.parameters(), *q.buffers()) if t.is_floating_point()]
    assert floating and {t.dtype for t in floating} == {torch.bfloat16}
    assert not is_quantized(q) and capsys.readouterr().err == ""  # fast here: nothing to say
    with torch.no_grad():
        ref, ours = model(*inputs), q(*inputs)
    assert ours.dtype == torch.bfloat16
    # 8 bits of mantissa on every weight and activation: under 2% here (int8: about 2%)
    assert _relative_error(ours.float(), ref) < 0.02
    assert (ours.float().argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_bf16_where_its_products_are_slow_warns_and_int8_then_bf16_is_refused(monkeypatch, capsys):
    measured = []
    monkeypatch.setattr(quantize_module, "bf16_speedup", lambda *a: measured.append(a) or 0.12)
    environ = {"LRU_CACHE_CAPACITY": "7"}  # set by the user: kept
    monkeypatch.setattr(device_module.os, "environ", environ)
    model = tiny_transformer(50)
    quantize(model, "bf16")
    assert environ == {"LRU_CACHE_CAPACITY": "7", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}  # bounded
    err = capsys.readouterr().err
    assert "0.12× as fast as float32" in err and "slower" in err and len(err.strip().splitlines()) == 1
    d = model.config.d_model
    assert measured == [(torch.device("cpu"), 64, d, 4 * d)]  # a batch's rows at the model's width
    measured.clear()  # an ensemble's members in a ModuleList (a served classifier ensemble's model)
    wider = EncoderModel(EncoderConfig(vocab_size=50, n_layers=1, d_model=48, n_heads=4, d_ff=96))
    members = nn.ModuleList([tiny_transformer(50), wider])
    quantize(members, "bf16")
    assert measured == [(torch.device("cpu"), 64, 48, 4 * 48)]  # the widest member's width
    assert {p.dtype for p in members.parameters()} == {torch.bfloat16}
    with pytest.raises(ConfigError, match="int8 already"):
        quantize(quantize(tiny_transformer(50), "int8"), "bf16")
    with pytest.raises(ConfigError, match="one of int8 and bf16"):
        quantize(model, "int8")  # bfloat16 already
