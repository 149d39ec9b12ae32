"""The cost of R-Drop's loss: forward and backward of the output projection and the loss for two
passes of N target tokens, alternating, one thread by default:

- ``plain``: the fused label-smoothed loss over the 2N rows (what the same doubled batch costs
  without the consistency term; ``OutputProjection.loss``);
- ``formula``: ``r_drop_loss``, autograd through the formula;
- ``fused``: ``fused_r_drop_loss``, the gradient written out (what training runs).

The shapes default to the en→de recipe with 2 × 2,048-token batches: ≈ 1,800 real target tokens per
process and pass, 5,322 output pieces, d_model 128. Reported: median seconds and ratios.

    python benchmarks/r_drop_loss.py --json results/bench-r-drop-loss.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from provenance import run_main, write_result

from aiayn.cli.demo import machine
from aiayn.modules.loss import fused_r_drop_loss, linear_label_smoothed_nll_loss, r_drop_loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1800, help="N: real target tokens per pass")
    ap.add_argument("--vocab", type=int, default=5322)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if min(args.tokens, args.vocab, args.d_model, args.repeats, args.threads) < 1:
        ap.error("--tokens, --vocab, --d-model, --repeats and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    h = torch.randn(2 * args.tokens, args.d_model, requires_grad=True)  # (2N, d_model): pass a, then b
    w = (torch.randn(args.vocab, args.d_model) / args.d_model**0.5).requires_grad_()
    target = torch.randint(1, args.vocab, (args.tokens,))

    def plain():
        return linear_label_smoothed_nll_loss(h, w, target.repeat(2), 0.1, smoothing_exclude=0)[0]

    def formula():
        logits_a, logits_b = (h @ w.t()).chunk(2)
        return r_drop_loss(logits_a, logits_b, target, 0.1, 3.0, smoothing_exclude=0)[0]

    def fused():
        return fused_r_drop_loss(h @ w.t(), target, 0.1, 3.0, smoothing_exclude=0)[0]

    kinds = {"plain": plain, "formula": formula, "fused": fused}
    times: dict[str, list[float]] = {name: [] for name in kinds}
    for i in range(args.repeats + 1):
        for name, loss in kinds.items():  # alternate, so each sees the same machine state
            h.grad = w.grad = None
            t0 = time.perf_counter()
            loss().backward()
            if i:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
    med = {name: round(statistics.median(t), 4) for name, t in times.items()}
    result = {"tokens_per_pass": args.tokens, "vocab": args.vocab, "d_model": args.d_model,
              "machine": f"{machine()}, {args.threads} thread(s)", "seconds": med,
              "formula_over_fused": round(med["formula"] / med["fused"], 2),
              "fused_over_plain": round(med["fused"] / med["plain"], 2)}  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.json:
        write_result(args.json, result)  # atomically


if __name__ == "__main__":
    run_main(main)
