"""``aiayn average``: average the last K checkpoints of a run into a model directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.cli.commands import summary
from aiayn.cli.decode_options import warn
from aiayn.errors import ConfigError
from aiayn.outputs import check_output


def add_parser(sub) -> None:
    p = sub.add_parser(
        "average",
        help=summary("average"),
        epilog="example:\n  aiayn average runs/de-en --last 5 --out runs/de-en/averaged",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", help="a training run directory (with step-* checkpoints)")
    p.add_argument("--last", type=int, default=5, help="how many of the newest checkpoints (default 5)")
    p.add_argument("--out", help="output model directory (default RUN_DIR/averaged)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace --out if it already holds a model (never a training run)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from aiayn.training.average import average_checkpoints, last_checkpoints
    from aiayn.training.checkpoint import STATE_JSON, step_dirs

    if args.last < 1:
        raise ConfigError(f"--last={args.last} must be ≥ 1")
    paths = last_checkpoints(args.run_dir, args.last)
    newest = int(paths[-1].name.removeprefix("step-"))
    newer = [p for n, p in step_dirs(Path(args.run_dir), complete=False) if n > newest]
    if newer:  # a checkpoint lacking its trainer state is not one: the user expected it averaged
        warn(f"{', '.join(p.name for p in newer)} in {args.run_dir} lack(s) {STATE_JSON} (not a complete "
             f"checkpoint): left out; the newest averaged is {paths[-1].name}")  # fmt: skip
    if len(paths) < args.last:
        kept = f"{len(paths)} recent checkpoint(s)"
        warn(f"{args.run_dir} keeps only {kept}, not --last {args.last}: averaging those (see keep_last)")
    out = check_output(args.out or Path(args.run_dir) / "averaged", tuple(paths), directory=True,
                       force=args.force, option="--out", runs=False)  # fmt: skip
    out = average_checkpoints(paths, out)
    print(f"averaged {len(paths)} checkpoints ({paths[0].name} … {paths[-1].name}) into {out}")
    return 0
