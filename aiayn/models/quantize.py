"""Lower-precision inference: dynamic int8 quantization, or bfloat16 weights and activations.

``int8``: every Linear — the attention projections, the feed-forward layers and the output projection — gets
int8 weights (one scale per output row) and quantizes its input on the fly, per batch (PyTorch's
dynamic quantization, fbgemm/x86 kernels). Embeddings, LayerNorm and softmax stay float32. A tied
output projection gets an int8 copy of the embedding matrix; the embedding itself is untouched.
The input is quantized to 8 bits everywhere (``Int8Linear``); the weights to 8 bits where fbgemm's
products are exact for both (AVX512_VNNI) and to 7 elsewhere (``int8_qconfig``, ``exact_8_bit_inputs``).

``bf16``: every weight and buffer cast to bfloat16, so that every product, the attention and the
residual stream run in bfloat16 (CTranslate2's ``compute_type="bfloat16"``); the output layer's
logits are read in float32 (log-softmax, beam scores, class probabilities). It halves the weights'
memory traffic and runs the products on the CPU's bfloat16 instructions (AVX512_BF16, AMX); where
the CPU has none, bfloat16 is emulated and slower than float32, and ``quantize`` says so. Unlike
int8 it also runs on a GPU; unlike int8 it rounds LayerNorm, the attention and the residual stream too.

Quantized models are for inference only: they cannot be trained or saved back as checkpoints.
"""

from __future__ import annotations

import functools
import sys
import warnings

import torch
from torch import nn

from aiayn.device import bf16_speedup, bound_onednn_caches
from aiayn.errors import ConfigError
from aiayn.modules.attention import MultiHeadAttention
from aiayn.modules.embedding import OutputProjection

QUANTIZATIONS = ("none", "int8", "bf16")
DYNAMIC_LINEAR = torch.ao.nn.quantized.dynamic.Linear
# bfloat16 products measured below this many times float32's speed are emulated: a warning says so
BF16_SLOW = 1.0


def quantize(model: nn.Module, name: str = "int8") -> nn.Module:
    """Quantize ``model`` in place (``name="int8"`` or ``"bf16"``) and return it in eval mode; "none"
    does nothing."""
    if name not in QUANTIZATIONS:
        raise ConfigError(f"--quantize={name!r} is not one of {QUANTIZATIONS}")
    model.eval()
    if name == "none":
        return model
    if name == "bf16":
        return to_bfloat16(model)
    if is_quantized(model):
        return model  # int8 already
    weight = next(model.parameters())
    if weight.device.type != "cpu":
        raise ConfigError("--quantize int8 runs on the CPU only: load the model with --device cpu")
    if weight.dtype != torch.float32:
        raise ConfigError(f"--quantize int8 quantizes float32 weights, not {weight.dtype}: take one of int8 "
                          "and bf16")  # fmt: skip
    split_sliced_weights(model)
    qconfig = int8_qconfig(weight_bits=8 if exact_8_bit_inputs() else 7)
    with warnings.catch_warnings():  # torch.ao's dynamic quantization warns of a future deprecation
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
    for parent, attr, child in children_of_type(model, DYNAMIC_LINEAR):
        setattr(parent, attr, Int8Linear(child))
    return model


def int8_qconfig(weight_bits: int = 8) -> torch.ao.quantization.QConfig:
    """torch.ao's per-channel dynamic qconfig (one symmetric scale per output row), its weights in
    [-128, 127] (``weight_bits=8``) or in [-64, 63] (7).

    Without VNNI, fbgemm adds pairs of products of an 8-bit input (0..255) and an 8-bit weight in 16
    bits, which overflow past 32,767: 2 × 255 × 64 = 32,640 fits, 2 × 255 × 127 does not. torch.ao
    keeps the sums in range by taking 7 bits from every input (``reduce_range``); ``quantize`` takes
    them from the weights instead, where each output row has its own scale, which halves the error of
    a product whose rows have different scales (``tests/models/test_quantize.py``)."""
    if weight_bits not in (7, 8):
        raise ConfigError(f"int8 weights take 7 or 8 bits, not {weight_bits}")
    weight = torch.ao.quantization.PerChannelMinMaxObserver.with_args(
        dtype=torch.qint8, qscheme=torch.per_channel_symmetric, reduce_range=weight_bits == 7
    )
    return torch.ao.quantization.QConfig(activation=torch.ao.quantization.default_dynamic_quant_observer,
                                         weight=weight)  # fmt: skip


def children_of_type(model: nn.Module, cls: type) -> list[tuple[nn.Module, str, nn.Module]]:
    """``(parent, attribute, child)`` for every submodule of exactly type ``cls``, listed in full
    before the caller replaces any (``setattr(parent, attribute, new)``)."""
    return [(parent, attr, child) for parent in model.modules()
            for attr, child in parent.named_children() if type(child) is cls]  # fmt: skip


class Int8Linear(nn.Module):
    """torch.ao's dynamically quantized Linear, its input quantized to 8 bits (``reduce_range=False``)
    or to 7 (``True``, what torch.ao does on every CPU).

    fbgemm's int8 products on a CPU without VNNI add pairs of 8-bit products in 16 bits, which inputs
    and weights of the full 8-bit range can overflow; torch.ao therefore quantizes every input to 7
    bits, which doubles its rounding error. With AVX512_VNNI the products accumulate in 32 bits and
    the full range is exact; elsewhere ``quantize`` gives the weights 7 bits instead (``int8_qconfig``),
    so that 8-bit inputs are exact on every CPU.

    Shape: x (..., in_features) -> (..., out_features)"""

    def __init__(self, dynamic: nn.Module, reduce_range: bool = False):
        super().__init__()
        self.dynamic, self.reduce_range = dynamic, reduce_range

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.dynamic._packed_params._packed_params
        return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=self.reduce_range).to(x.dtype)

    def extra_repr(self) -> str:
        return f"reduce_range={self.reduce_range}"


@functools.cache
def exact_8_bit_inputs() -> bool:
    """Whether fbgemm's int8 products are exact for inputs and weights of the full 8-bit range on this
    CPU, measured on the products that overflow 16-bit pair sums (every input 255, every weight 127),
    at one row and at 64.

    The CPU's flags do not say it: fbgemm has VNNI kernels for AVX512_VNNI only, so a CPU with
    AVX-VNNI alone (many laptops) runs its AVX2 kernels and overflows, and ``FBGEMM_ENABLE_INSTRUCTIONS``
    can make any CPU run them. Measured once per process (a fraction of a millisecond)."""
    linear = nn.Linear(256, 1, bias=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        linear.weight.fill_(1.0)
        qconfig = {nn.Linear: int8_qconfig()}
        dynamic = torch.ao.quantization.quantize_dynamic(nn.Sequential(linear), qconfig)[0]
        x = torch.ones(64, 256)
        x[:, 0] = 0.0  # the range starts at 0: the other inputs quantize to 255
        packed = dynamic._packed_params._packed_params
        outs = [torch.ops.quantized.linear_dynamic(rows, packed, reduce_range=False) for rows in (x[:1], x)]
    # 255 when exact; a saturated sum of pairs gives about half
    return all(bool((out > 250).all()) for out in outs)


def to_bfloat16(model: nn.Module) -> nn.Module:
    """``model`` with every floating-point weight and buffer in bfloat16 (in place), and a warning
    on stderr where this device's bfloat16 products are slower than its float32 ones."""
    if is_quantized(model):
        raise ConfigError("this model is quantized to int8 already; --quantize takes one of int8 and bf16")
    device = next(model.parameters()).device
    if device.type == "cpu":
        bound_onednn_caches()  # bfloat16 products go through oneDNN
    model.to(torch.bfloat16)
    # the widest model inside: an ensemble's members (an nn.ModuleList of them) may differ in width
    d = max(m.config.d_model for m in model.modules() if hasattr(getattr(m, "config", None), "d_model"))
    speedup = bf16_speedup(device, 64, d, 4 * d)  # a batch's rows against the model's width
    if speedup < BF16_SLOW:
        print(f"aiayn: bfloat16 products run {speedup:.2f}× as fast as float32 on this {device.type} "
              "(no AVX512_BF16 or AMX?): --quantize bf16 decodes slower here than --quantize none "
              "(int8 is the faster choice on such CPUs)", file=sys.stderr)  # fmt: skip
    return model


def split_sliced_weights(model: nn.Module) -> None:
    """Give every weight slice a module applies its own ``nn.Linear``, so that converting Linears
    (int8, oneDNN packing) reaches them: the row blocks of ``w_qkv`` that attention over a memory
    applies (``MultiHeadAttention.split_row_blocks``; self-attention's one product of ``w_qkv`` is
    left whole) and an ``output_pieces`` head's piece rows. Outputs are unchanged."""
    for path, m in model.named_modules():
        if isinstance(m, MultiHeadAttention) and not path.endswith("self_attn"):
            m.split_row_blocks()
        elif isinstance(m, OutputProjection):
            m.split_pieces()


def is_quantized(model: nn.Module) -> bool:
    return any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())
