"""The Linear products of a decoding step, kernel by kernel, with the weight in cache and out of it.

A decoding step multiplies a few rows (one sentence's beam: 4; a batch's: 64 or more) by every
weight of the decoder once. How long such a product takes depends on the CPU's BLAS far more than
on its arithmetic: a product of 4 rows does almost no work, so what it costs is the kernel's fixed
overhead and, for the output projection, reading the weight from memory. This times, for the
shapes of ``make demo``'s model (d_model 128, d_ff 256, 8,000 pieces) and of OPUS-MT's (512, 2048,
the same vocabulary):

- ``blas``: ``F.linear`` (PyTorch's BLAS: MKL in the PyPI wheel), what ``--gemm blas`` runs;
- ``onednn``: oneDNN's inner product on a weight reordered once (``aiayn.models.prepack.PackedLinear``,
  ``--gemm onednn``);
- ``blas-wx``: the same product as (W xᵀ)ᵀ, which walks the weight row by row.

``hot``: the same product repeated (the weight stays in cache); ``cold``: a 64 MB buffer is written
between two products, as the rest of a step evicts the weight in a real search. Median of
``--repeats`` calls, in µs.

    python benchmarks/linear_kernels.py --threads 2 --json results/linear-kernels.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from provenance import run_main, write_result  # noqa: E402
from torch import nn  # noqa: E402

from aiayn.cli.demo import machine  # noqa: E402
from aiayn.models.prepack import PackedLinear  # noqa: E402

# (name, out_features, in_features): a decoder layer's products and the output projection
SHAPES = {
    "demo": [("w_qkv", 384, 128), ("w_o", 128, 128), ("ff_1", 256, 128), ("ff_2", 128, 256),
             ("output", 8000, 128)],
    "base": [("w_qkv", 1536, 512), ("w_o", 512, 512), ("ff_1", 2048, 512), ("ff_2", 512, 2048),
             ("output", 8000, 512)],
}  # fmt: skip
ROWS = (4, 64)


def timed(fn, repeats: int, flush: torch.Tensor | None) -> float:
    """The median µs of ``repeats`` calls of ``fn`` (after 10 untimed ones), writing ``flush``
    before each call when given."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush.add_(1.0)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1e6 * statistics.median(times), 1)


def kernels(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> dict:
    linear = nn.Linear(w.size(1), w.size(0), bias=b is not None)
    linear.weight.data.copy_(w)
    if b is not None:
        linear.bias.data.copy_(b)
    packed = PackedLinear(linear, rows=x.size(0))
    return {
        "blas": lambda: F.linear(x, w, b),
        "onednn": lambda: packed(x),
        "blas-wx": lambda: torch.addmm(b[:, None], w, x.t()).t() if b is not None else (w @ x.t()).t(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    flush = torch.zeros(16 * 2**20)  # 64 MB: more than the last-level cache of the CPUs measured
    rows = []
    with torch.inference_mode():
        for size, shapes in SHAPES.items():
            for name, n_out, n_in in shapes:
                w = torch.randn(n_out, n_in) / n_in**0.5
                b = None if name == "output" else torch.randn(n_out)
                for m in ROWS:
                    x = torch.randn(m, n_in)
                    for cache, fl in (("hot", None), ("cold", flush)):
                        row = {"size": size, "product": name, "rows": m, "in": n_in, "out": n_out,
                               "cache": cache}  # fmt: skip
                        row.update({k: timed(fn, args.repeats, fl) for k, fn in kernels(x, w, b).items()})
                        rows.append(row)
                        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        write_result(args.json, {"machine": machine(), "threads": args.threads, "torch": torch.__version__,
                                 "unit": "µs, median", "products": rows,
                                 "command": " ".join(sys.argv)})  # fmt: skip


if __name__ == "__main__":
    run_main(main)
