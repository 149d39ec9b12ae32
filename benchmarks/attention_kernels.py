"""Attention on the CPU: the explicit products against PyTorch's fused kernel, by key length.

``aiayn.modules.attention.scaled_dot_product_attention`` computes softmax(Q Kᵀ/√d_k) V with three
batched products (``q @ kᵀ``, softmax, ``@ v``) when there are at most ``EXPLICIT_MAX_KEYS`` keys and
more than one query, and calls ``F.scaled_dot_product_attention`` otherwise. This measures both
paths on Transformer-tiny shapes (4 heads of 32, or ``--heads``/``--head-dim``; a 4,096-token batch:
B = 4096 / T sentences, a
padding mask in the encoder and a look-ahead mask in the decoder), forward + backward and forward
only, so the threshold can be checked on any machine, and what aiayn's layers run (the dispatch between the
two) against ``F.scaled_dot_product_attention`` alone. Reported: milliseconds (best of 5 repeats of 5
calls) and the fused/explicit and fused/aiayn ratios (> 1: faster than the fused kernel). ``--precision bf16``
takes bfloat16 queries, keys and values under bf16 autocast, as a model trained with
``precision=bf16`` hands them over (training in bfloat16 has its own threshold,
``EXPLICIT_MAX_KEYS_BF16_TRAINING``).

It also times the explicit path's softmax alone by row length ("softmax_rows"): PyTorch's
``softmax(dim=-1)`` against ``attention.softmax_last``, which pads rows shorter than one SIMD
vector (``SOFTMAX_MIN_ROW`` float32 values, twice as many bfloat16 ones) with −∞ because PyTorch's
CPU kernel is slow on them; with ``--precision bf16`` the scores are bfloat16.

    python benchmarks/attention_kernels.py --threads 2 --json results/bench-attention-kernels.json
    python benchmarks/attention_kernels.py --threads 1 --precision bf16 --softmax-lengths
    python benchmarks/attention_kernels.py --threads 2 --lengths 128 256 512 --head-dim 64 --softmax-lengths
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
import torch.nn.functional as F
from provenance import run_main, write_result

from aiayn.cli.demo import machine
from aiayn.modules import attention


def explicit(q, k, v, mask):
    return attention.scaled_dot_product_attention(q, k, v, mask, need_weights=True)[0]  # explicit path


def dispatched(q, k, v, mask):
    return attention.scaled_dot_product_attention(q, k, v, mask)[0]  # what aiayn's layers run


def fused(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def best_ms(fn, inputs: tuple, grad: torch.Tensor | None, repeat: int = 5, calls: int = 5, amp=None) -> float:
    """Milliseconds per call of ``fn(*inputs)``, with ``.backward(grad)`` unless grad is None, under
    the autocast context ``amp`` if one is given."""

    def once():
        with amp or contextlib.nullcontext():
            if grad is None:
                with torch.no_grad():
                    fn(*inputs)
                return
            out = fn(*inputs)
        out.backward(grad)

    for _ in range(3):
        once()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            once()
        times.append((time.perf_counter() - t0) / calls)
    return min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[12, 20, 30, 64, 128, 256])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--softmax-lengths", type=int, nargs="*", default=[4, 8, 12, 13, 15, 16, 20, 32])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument(
        "--head-dim", type=int, default=32, help="32: Transformer-tiny; 64: the BERT-style encoders"
    )
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16" else None
    rows = []
    for length in args.lengths:
        b = max(args.tokens // (length + 1), 8)
        for kind in ("padding", "causal"):
            if kind == "causal":
                mask = torch.ones(length, length, dtype=torch.bool).tril()[None, None]
            else:
                lens = torch.randint(max(1, length - 4), length + 1, (b,))
                mask = (torch.arange(length)[None] < lens[:, None])[:, None, None, :]
            for backward in (True, False):
                shape = (b, args.heads, length, args.head_dim)  # default: Transformer-tiny's 4 heads of 32
                q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=backward) for _ in range(3))
                grad = torch.randn(shape, dtype=dtype) if backward else None
                kernels = (("explicit", explicit), ("fused", fused), ("aiayn", dispatched))
                t = {name: best_ms(fn, (q, k, v, mask), grad, amp=amp) for name, fn in kernels}
                row = {"keys": length, "batch": b, "mask": kind, "pass": "fwd+bwd" if backward else "fwd",
                       "explicit_ms": round(t["explicit"], 2), "fused_ms": round(t["fused"], 2),
                       "aiayn_ms": round(t["aiayn"], 2),
                       "fused_over_aiayn": round(t["fused"] / t["aiayn"], 2),
                       "fused_over_explicit": round(t["fused"] / t["explicit"], 2)}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    softmax_rows = []
    for length in args.softmax_lengths:  # (B·h, T, T) scores of a 4,096-token batch, forward + backward
        shape = (4 * max(args.tokens // (length + 1), 8), length, length)
        x = torch.randn(shape, dtype=dtype, requires_grad=True)
        t = {name: best_ms(fn, (x,), torch.randn_like(x)) for name, fn in (
            ("native", lambda s: s.softmax(dim=-1)), ("padded", attention.softmax_last))}  # fmt: skip
        row = {"keys": length, "native_ms": round(t["native"], 3), "aiayn_ms": round(t["padded"], 3),
               "native_over_aiayn": round(t["native"] / t["padded"], 2)}  # fmt: skip
        softmax_rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"machine": f"{machine()}, {torch.get_num_threads()} threads", "torch": torch.__version__,
              "heads": args.heads, "head_dim": args.head_dim,
              "precision": args.precision,
              "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "explicit_max_keys": attention.EXPLICIT_MAX_KEYS, "softmax_min_row": attention.SOFTMAX_MIN_ROW,
              "explicit_max_keys_bf16_training": attention.EXPLICIT_MAX_KEYS_BF16_TRAINING,
              "rows": rows, "softmax_rows": softmax_rows}  # fmt: skip
    if args.json:
        write_result(args.json, result)  # temp file + rename: nothing half-written


if __name__ == "__main__":
    run_main(main)
