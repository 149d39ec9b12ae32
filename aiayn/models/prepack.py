"""oneDNN weight prepacking of a trained model's Linear layers, for faster float32 CPU inference.

PyTorch's CPU ``nn.Linear`` hands its product to the BLAS its wheel ships (MKL). On some CPUs —
those of other vendors, where MKL does not select its fastest kernels — the products decoding makes
(a few rows against a wide weight: the output projection, the feed-forward layers) run far below
what the memory allows. oneDNN's inner-product primitive, with the weight reordered once into its blocked
layout, does not have that problem; CTranslate2 picks oneDNN on such CPUs for the same reason
(docs/inference.md has the measurements). ``prepack(model, "onednn")`` replaces every Linear with a
``PackedLinear`` holding the reordered weight; ``"auto"`` decides per weight shape by timing both
kernels on it (``faster_kernels``), so a CPU where the BLAS is faster keeps the BLAS.

Outputs keep the model's dtype (float32, or bfloat16 after ``--quantize bf16``, whose weights are packed
for oneDNN's bfloat16 kernels); in float32 they differ from the BLAS's by summation order only (about
1e-6 relative).
Packed models are for inference only, like quantized ones: the packed weight is an opaque oneDNN
tensor that cannot be trained, moved or saved.
"""

from __future__ import annotations

import functools
import time

import torch
from torch import Tensor, nn

from aiayn.device import bound_onednn_caches
from aiayn.errors import ConfigError
from aiayn.models.quantize import children_of_type, is_quantized, split_sliced_weights

GEMMS = ("blas", "onednn", "auto")
TIMED_ROWS = (4, 128)  # auto times each shape at these rows: one sentence's beam, a batch's beams


class PackedLinear(nn.Module):
    """``nn.Linear``'s y = x Wᵀ + b through oneDNN's inner product on a prepacked W.

    ``rows`` is the number of rows the layout is tuned for (None: oneDNN's choice for any number).

    Shape: x (..., in_features) -> (..., out_features)"""

    def __init__(self, linear: nn.Linear, rows: int | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)  # opaque: not a buffer
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


def available() -> bool:
    """Whether this PyTorch build has oneDNN's CPU linear kernels."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def packs_dtype(dtype: torch.dtype) -> bool:
    """Whether oneDNN can pack weights of ``dtype`` on this CPU: its bfloat16 inner product needs
    AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, and on an AVX2-only CPU the reorder refuses. Asked of
    oneDNN itself, with a one-row weight, rather than read from the CPU's flags."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(1, 16, dtype=dtype), None)
    except RuntimeError:
        return False
    return True


def prepack(model: nn.Module, gemm: str = "onednn") -> nn.Module:
    """Pack ``model``'s Linear layers in place for oneDNN (``gemm="onednn"``, or ``"auto"``: only the
    shapes where a timing finds oneDNN faster) and return it in eval mode; ``"blas"`` does nothing."""
    if gemm not in GEMMS:
        raise ConfigError(f"--gemm={gemm!r} is not one of {GEMMS}")
    model.eval()
    if gemm == "blas":
        return model
    if is_quantized(model):
        if gemm == "auto":
            return model  # int8 Linears have kernels of their own
        raise ConfigError(
            "--gemm onednn packs float32 weights; with --quantize int8 leave --gemm at blas or auto"
        )
    if next(model.parameters()).device.type != "cpu":
        if gemm == "auto":
            return model  # oneDNN's packed kernels are the CPU's; elsewhere nothing is faster
        raise ConfigError(f"--gemm {gemm} packs weights for the CPU: load the model with --device cpu")
    if not available():
        if gemm == "auto":
            return model
        raise ConfigError("--gemm onednn: this PyTorch build has no oneDNN (mkldnn); use --gemm blas")
    bound_onednn_caches()
    dtype = next(model.parameters()).dtype
    if not packs_dtype(dtype):
        if gemm == "auto":
            return model  # the BLAS is the only kernel this CPU has for this dtype
        raise ConfigError(
            f"--gemm onednn: this CPU has no oneDNN kernels for {dtype} weights (they need AVX-512 or "
            "AVX-NE-CONVERT); use --gemm blas or auto"
        )
    split_sliced_weights(model)
    linears = children_of_type(model, nn.Linear)
    shapes = {_shape(child) for _, _, child in linears}
    packed = shapes if gemm == "onednn" else faster_kernels(shapes, dtype=dtype)
    with torch.no_grad():
        for parent, name, child in linears:
            if _shape(child) in packed:
                setattr(parent, name, PackedLinear(child))
    return model


def _shape(linear: nn.Linear) -> tuple[int, int, bool]:
    return linear.in_features, linear.out_features, linear.bias is not None


def faster_kernels(
    shapes: set[tuple[int, int, bool]], repeats: int = 5, dtype: torch.dtype = torch.float32
) -> set[tuple[int, int, bool]]:
    """The (in, out, bias) shapes whose product oneDNN computes faster than the BLAS in ``dtype``: timed
    on random weights at each of ``TIMED_ROWS`` rows (best of ``repeats``), oneDNN wins when the product
    of its time ratios is below 1 (so a few rows weigh as much as many)."""
    faster = set()
    with torch.no_grad():
        for d_in, d_out, bias in shapes:
            linear = nn.Linear(d_in, d_out, bias=bias, dtype=dtype)
            packed = PackedLinear(linear)
            ratio = 1.0
            for rows in TIMED_ROWS:
                x = torch.randn(rows, d_in, dtype=dtype)
                ratio *= _best_time(packed, x, repeats) / _best_time(linear, x, repeats)
            if ratio < 1.0:
                faster.add((d_in, d_out, bias))
    return faster


def _best_time(kernel: nn.Module, x: Tensor, repeats: int) -> float:
    kernel(x)  # warm-up: oneDNN creates its primitive on the first call
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        kernel(x)
        best = min(best, time.perf_counter() - t0)
    return best


def is_packed(model: nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())
