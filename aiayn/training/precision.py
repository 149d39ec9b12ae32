"""The arithmetic a run trains in: fp32, bf16 or fp16 autocast, and ``precision="auto"``.

Mixed precision keeps float32 master weights and runs the products in a 16-bit type under
``torch.autocast``; fp16 also needs loss scaling (the trainer's ``GradScaler``) and a CUDA device.
"auto" measures, once, whether bfloat16 products are faster than float32 ones on this device, and
trains in bf16 only where they are: elsewhere bfloat16 is emulated and slower.
"""

from __future__ import annotations

import contextlib
import sys
import time

import torch
from torch import nn

from aiayn.errors import ConfigError
from aiayn.training.distributed import DistInfo, all_reduce_sum

# precision="auto" trains in bf16 where a bfloat16 matrix product of the model's feed-forward size
# runs at least this many times faster than a float32 one (CPUs with AVX512_BF16 or AMX, CUDA GPUs
# with bfloat16); elsewhere bfloat16 is emulated and slower, and fp32 is kept.
AUTO_BF16_MIN_SPEEDUP = 1.25


def bf16_speedup(device: torch.device, tokens: int, d_model: int, d_ff: int) -> float:
    """float32 time / bfloat16 time of a (tokens × d_model) · (d_model × d_ff) product on this
    device now, each the best of 5 after one warm-up call (a fraction of a second on a CPU)."""

    def best(dtype: torch.dtype) -> float:
        x = torch.randn(tokens, d_model, device=device, dtype=dtype)
        w = torch.randn(d_ff, d_model, device=device, dtype=dtype)
        times = []
        for _ in range(6):  # the first call warms up and is not counted
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            nn.functional.linear(x, w)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    return best(torch.float32) / best(torch.bfloat16)


def autocast(device: torch.device, precision: str):
    """The context a forward pass runs in: nothing for fp32, ``torch.autocast`` to bfloat16 or
    float16 otherwise; ``ConfigError`` for fp16 off CUDA."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("precision=fp16 needs a CUDA device; use bf16 on CPU")
    return torch.autocast(device.type, dtype=dtype)


def resolve_precision(precision: str, device: torch.device, dist: DistInfo, tokens: int, model_config) -> str:
    """``precision``, with "auto" decided by rank 0's measurement (``bf16_speedup`` of a
    ``tokens``-row product of the feed-forward size of ``model_config``, which has ``d_model`` and
    ``d_ff``) so that every rank trains alike."""
    if precision != "auto":
        return precision
    speedup = torch.zeros((), device=device)
    if dist.is_main:
        speedup += bf16_speedup(device, tokens, model_config.d_model, model_config.d_ff)
    speedup = float(all_reduce_sum(speedup, dist))
    chosen = "bf16" if speedup >= AUTO_BF16_MIN_SPEEDUP else "fp32"
    if dist.is_main:
        print(f"aiayn train: precision=auto chose {chosen}: bfloat16 products ran "
              f"{speedup:.2f}× as fast as float32 here (bf16 from {AUTO_BF16_MIN_SPEEDUP}×)",
              file=sys.stderr)  # fmt: skip
    return chosen
