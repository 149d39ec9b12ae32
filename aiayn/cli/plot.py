"""``aiayn plot``: training-curve PNGs (loss, lr, BLEU vs step) from a run's metrics."""

from __future__ import annotations

import argparse

from aiayn.atomic import check_figure_dir


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plot",
        help="plot a run's training curves",
        epilog="example:\n  aiayn plot runs/de-en            # writes runs/de-en/{loss,lr,bleu}.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", help="a training run directory (with metrics.jsonl)")
    p.add_argument("--out", help="folder for the PNGs (default: the run directory); new, empty, or "
                   "holding only these PNGs")  # fmt: skip
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from aiayn.viz.curves import is_curve, plot_curves

    if args.out is not None:  # the run directory itself (the default) is aiayn's
        check_figure_dir(args.out, is_curve)
    for path in plot_curves(args.run_dir, args.out):
        print(path)
    return 0
