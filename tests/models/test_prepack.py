"""oneDNN weight prepacking: a PackedLinear computes what torch's nn.Linear computes, a packed model's
outputs and searches are those of the unpacked one, and "auto" packs exactly the shapes its timing
finds faster."""

import copy

import pytest
import torch
from torch import nn

from aiayn.decoding.options import SearchConfig
from aiayn.decoding.translator import Translator
from aiayn.errors import ConfigError
from aiayn.models import prepack as prepack_module
from aiayn.models import quantize as quantize_module
from aiayn.models.prepack import PackedLinear, available, is_packed, packs_dtype, prepack
from aiayn.models.quantize import quantize
from aiayn.modules.attention import MultiHeadAttention
from tests.decoding.fixtures import tiny_transformer
from tests.helpers import assert_close
from tests.models.test_quantize import _models

pytestmark = pytest.mark.skipif(not available(), reason="this PyTorch build has no oneDNN")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 24), (3, 7, 24), (1, 24)])
def test_packed_linear_equals_torch_linear(shape, bias):
    torch.manual_seed(0)
    linear = nn.Linear(24, 40, bias=bias)
    x = torch.randn(shape)
    with torch.no_grad():
        ours, ref = PackedLinear(linear)(x), linear(x)
    assert ours.shape == ref.shape == (*shape[:-1], 40)
    assert_close(f"packed linear {shape}", ours, ref, atol=1e-5)
    with torch.no_grad():  # a transposed (non-contiguous) input reads the same
        xt = torch.randn(7, 3, 24).transpose(0, 1)
        assert_close("transposed input", PackedLinear(linear)(xt), linear(xt), atol=1e-5)


@pytest.mark.parametrize("name", list(_models()))
def test_onednn_packs_every_linear_and_changes_no_output(name):
    model, inputs = _models()[name]
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    packed = prepack(copy.deepcopy(model), "onednn")
    assert is_packed(packed) and not is_packed(model)
    assert not any(type(m) is nn.Linear for m in packed.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) >= n_linear
    with torch.no_grad():
        assert_close(f"packed {name}", packed(*inputs), model(*inputs), atol=1e-4)


@pytest.mark.parametrize("gemm", ["onednn", "auto"])
def test_a_bf16_model_packs_its_bfloat16_weights_and_changes_no_output(gemm, monkeypatch):
    monkeypatch.setattr(quantize_module, "bf16_speedup", lambda *a: 2.0)
    timed, real_best_time = [], prepack_module._best_time
    timer = lambda k, x, r: timed.append(x.dtype) or real_best_time(k, x, r)  # noqa: E731
    monkeypatch.setattr(prepack_module, "_best_time", timer)
    model, inputs = _models()["transformer"]
    bf16 = quantize(copy.deepcopy(model), "bf16")
    if not packs_dtype(torch.bfloat16):  # an AVX2-only CPU: oneDNN has no bfloat16 inner product
        if gemm == "onednn":
            with pytest.raises(ConfigError, match="no oneDNN kernels for torch.bfloat16"):
                prepack(copy.deepcopy(bf16), gemm)
            return
        kept = prepack(copy.deepcopy(bf16), gemm)
        assert not is_packed(kept) and not timed
        with torch.no_grad():
            assert torch.equal(kept(*inputs), bf16(*inputs))
        return
    packed = prepack(copy.deepcopy(bf16), gemm)
    assert {p.dtype for p in packed.parameters()} == {torch.bfloat16}
    assert set(timed) == ({torch.bfloat16} if gemm == "auto" else set())  # auto times bfloat16 kernels
    assert is_packed(packed) or gemm == "auto"
    with torch.no_grad():
        ours, ref = packed(*inputs), bf16(*inputs)
    assert ours.dtype == torch.bfloat16
    # the same bfloat16 products summed in another order: well within bfloat16's precision of float32
    assert_close(f"packed bf16 ({gemm})", ours.float(), ref.float(), atol=0.1)


def test_a_dtype_onednn_cannot_pack_here_keeps_the_blas_or_is_refused(monkeypatch):
    """Where oneDNN has no kernel for the weights' dtype (bfloat16 on an AVX2-only CPU), ``auto``
    keeps every Linear as it is and ``onednn`` says why in one line, instead of oneDNN's error."""
    assert packs_dtype(torch.float32)  # float32 packs on every CPU oneDNN runs on
    monkeypatch.setattr(prepack_module, "packs_dtype", lambda dtype: False)
    model, _ = _models()["transformer"]
    assert not is_packed(prepack(copy.deepcopy(model), "auto"))
    with pytest.raises(ConfigError, match="use --gemm blas or auto"):
        prepack(copy.deepcopy(model), "onednn")


def test_auto_off_the_cpu_keeps_every_linear_and_onednn_is_refused():
    """oneDNN's packed kernels are the CPU's: ``auto`` on another device (a GPU; ``meta`` here, which
    needs none) packs nothing, as it packs nothing where MKL is faster; ``onednn`` says why in one line."""
    model = tiny_transformer(50).to("meta")
    assert prepack(model, "auto") is model and not is_packed(model)
    with pytest.raises(ConfigError, match="packs weights for the CPU"):
        prepack(model, "onednn")


def test_a_packed_translator_searches_as_the_plain_one():
    torch.manual_seed(3)
    model = tiny_transformer(50, norm_first=True).eval()
    sources = [[5, 9, 12, 7], [8, 4, 30, 31, 22, 6], [17]]
    plain = Translator(model, None, None)
    packed = Translator(prepack(copy.deepcopy(model), "onednn"), None, None)
    for beam in (1, 4):
        config = SearchConfig(beam=beam, max_len=12, nbest=beam)
        ours = packed.search(sources, config, max_tokens=10**6)
        ref = plain.search(sources, config, max_tokens=10**6)
        for hyps, ref_hyps in zip(ours, ref):
            assert [h.tokens for h in hyps] == [h.tokens for h in ref_hyps]
            assert_close("scores", torch.tensor([h.score for h in hyps]),
                         torch.tensor([h.score for h in ref_hyps]), atol=1e-4)  # fmt: skip


def test_auto_packs_the_shapes_its_timing_finds_faster(monkeypatch):
    model = tiny_transformer(50)
    shapes = {
        (m.in_features, m.out_features, m.bias is not None) for m in model.modules() if type(m) is nn.Linear
    }
    output = (model.head.proj.in_features, model.head.proj.out_features, False)
    assert output in shapes and len(shapes) > 1

    def onednn_faster_for_output_only(kernel, x, repeats):  # a fake clock: oneDNN wins one shape only
        wins = isinstance(kernel, PackedLinear) and (kernel.in_features, kernel.out_features) == output[:2]
        return 1.0 if wins else 2.0 if isinstance(kernel, PackedLinear) else 1.5

    monkeypatch.setattr(prepack_module, "_best_time", onednn_faster_for_output_only)
    assert prepack_module.faster_kernels(shapes) == {output}
    packed = prepack(copy.deepcopy(model), "auto")
    assert isinstance(packed.head.proj, PackedLinear)
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == 1


def test_auto_on_the_real_clock_stays_exact():
    model, inputs = _models()["transformer"]
    packed = prepack(copy.deepcopy(model), "auto")
    with torch.no_grad():
        assert_close("auto", packed(*inputs), model(*inputs), atol=1e-4)


def test_blas_is_a_no_op_and_wrong_requests_are_refused():
    model = tiny_transformer(50)
    assert prepack(model, "blas") is model and not is_packed(model)
    with pytest.raises(ConfigError, match="mkl"):
        prepack(model, "mkl")
    q = quantize(copy.deepcopy(model), "int8")
    with pytest.raises(ConfigError, match="--quantize int8"):
        prepack(q, "onednn")
    assert not is_packed(prepack(q, "auto"))  # int8 keeps its own kernels


def test_a_mis_wired_packed_block_would_be_caught():
    """The tolerance above is tight enough to see a packed cross-attention block in the wrong place."""
    model, inputs = _models()["transformer"]
    packed = prepack(copy.deepcopy(model), "onednn")
    crossed = [m for m in packed.modules() if isinstance(m, MultiHeadAttention) and m.row_blocks is not None]
    assert len(crossed) == 2  # the decoder layers' cross-attention; self-attention needs no blocks
    first, second = (m.row_blocks for m in crossed)
    first["kv"], second["kv"] = second["kv"], first["kv"]  # each layer reads the other's keys and values
    with torch.no_grad():
        assert (packed(*inputs) - model(*inputs)).abs().max() > 1e-2
