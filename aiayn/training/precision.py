"""The arithmetic a run trains in: fp32, bf16 or fp16 autocast, and ``precision="auto"``.

Mixed precision keeps float32 master weights and runs the products in a 16-bit type under
``torch.autocast``; fp16 also needs loss scaling (the trainer's ``GradScaler``) and a CUDA device.
"auto" measures, once, whether bfloat16 products are faster than float32 ones on this device, and
trains in bf16 only where they are: elsewhere bfloat16 is emulated and slower.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from aiayn.device import bf16_speedup
from aiayn.errors import ConfigError
from aiayn.training.distributed import DistInfo, all_reduce_sum

# precision="auto" trains in bf16 where a bfloat16 matrix product of the model's feed-forward size
# runs at least this many times faster than a float32 one (CPUs with AVX512_BF16 or AMX, CUDA GPUs
# with bfloat16); elsewhere bfloat16 is emulated and slower, and fp32 is kept.
AUTO_BF16_MIN_SPEEDUP = 1.25


def autocast(device: torch.device, precision: str):
    """The context a forward pass runs in: nothing for fp32, ``torch.autocast`` to bfloat16 or
    float16 otherwise; ``ConfigError`` for fp16 off CUDA."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("precision=fp16 needs a CUDA device; use bf16 on CPU")
    return torch.autocast(device.type, dtype=dtype)


def resolve_precision(
    precision: str, device: torch.device, dist: DistInfo, tokens: int, model_config, kept: str = "auto"
) -> str:
    """``precision``, with "auto" decided by rank 0's measurement (``bf16_speedup`` of a
    ``tokens``-row product of the feed-forward size of ``model_config``, which has ``d_model`` and
    ``d_ff``) so that every rank trains alike; or, in a resumed run, ``kept``, what it chose when the
    run started (not a new measurement on another or a busier machine: a run's arithmetic does not
    change halfway; a checkpoint from before this was kept says "auto", and is measured again)."""
    if precision != "auto":
        return precision
    if kept != "auto":
        if dist.is_main:
            print(
                f"aiayn train: precision=auto keeps {kept}, as the run chose when it started", file=sys.stderr
            )
        return kept
    speedup = torch.zeros((), device=device)
    if dist.is_main:  # its random matrices drawn aside: the dropout masks' stream goes on untouched
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            speedup += bf16_speedup(device, tokens, model_config.d_model, model_config.d_ff)
    speedup = float(all_reduce_sum(speedup, dist))
    chosen = "bf16" if speedup >= AUTO_BF16_MIN_SPEEDUP else "fp32"
    if dist.is_main:
        print(f"aiayn train: precision=auto chose {chosen}: bfloat16 products ran "
              f"{speedup:.2f}× as fast as float32 here (bf16 from {AUTO_BF16_MIN_SPEEDUP}×)",
              file=sys.stderr)  # fmt: skip
    return chosen
