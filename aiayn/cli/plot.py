"""``aiayn plot``: training-curve PNGs (loss, lr, BLEU vs step) from a run's metrics."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plot",
        help="plot a run's training curves",
        epilog="example:\n  aiayn plot runs/de-en            # writes runs/de-en/{loss,lr,bleu}.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", help="a training run directory (with metrics.jsonl)")
    p.add_argument("--out", help="folder for the PNGs (default: the run directory)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from aiayn.viz.curves import plot_curves

    for path in plot_curves(args.run_dir, args.out):
        print(path)
    return 0
