"""``aiayn plot``: training-curve PNGs (loss, lr, BLEU vs step) from a run's metrics."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.cli.commands import summary
from aiayn.errors import DataError, OutputError
from aiayn.outputs import check_figure_dir


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plot",
        help=summary("plot"),
        epilog="example:\n  aiayn plot runs/de-en            # writes runs/de-en/{loss,lr,bleu}.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", help="a training run directory (with metrics.jsonl), or a metrics file")
    p.add_argument("--out", help="folder for the PNGs (default: the run directory; needed for a metrics "
                   "file outside one); new, empty, or holding only these PNGs, which a rerun replaces as a "
                   "set")  # fmt: skip
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from aiayn.training.rundir import TRAIN_CONFIG
    from aiayn.viz.curves import is_curve, plot_curves

    given = Path(args.run_dir)
    if not given.exists():
        raise DataError(f"{given}: no such file or directory; give a run directory or its metrics.jsonl")
    run_dir = given if given.is_dir() else given.parent
    if args.out is None and not (run_dir / TRAIN_CONFIG).is_file():
        raise OutputError(f"{given} is not in a training run directory; give --out FOLDER for the PNGs")
    is_run = (run_dir / TRAIN_CONFIG).is_file()  # a run directory is aiayn's: its plots are replaced
    if args.out is not None and not (is_run and Path(args.out).resolve() == run_dir.resolve()):
        check_figure_dir(args.out, is_curve)
    for path in plot_curves(args.run_dir, args.out):
        print(path)
    return 0
