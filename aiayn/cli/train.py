"""``aiayn train``: train a translation model or a language model from a recipe."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from aiayn.cli.commands import summary

EPILOG = """examples:
  aiayn train recipes/multi30k-de-en.toml
  aiayn train recipes/multi30k-de-en.toml out_dir=runs/de-en2 model.d_model=256 max_minutes=10
  aiayn train recipes/multi30k-de-en.toml out_dir=runs/de-en2 --resume
  aiayn train task=lm dataset=shakespeare tokenizer=char out_dir=runs/shakespeare
  torchrun --nproc_per_node=2 -m aiayn train recipes/multi30k-de-en.toml device=cpu

Overrides are key=value pairs of recipe fields in TOML syntax; model fields take a "model." prefix.
Ctrl-C (SIGINT) or SIGTERM stops the run with a checkpoint to --resume from; the exit status is then
130 or 143, as for a program those signals ended.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help=summary("train"),
        description="Train a model. A run directory (out_dir) collects checkpoints (step-N/, best), "
        "metrics.jsonl and train_config.json.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("recipe", nargs="?", help="a TOML recipe (see recipes/); omit for the defaults")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="recipe fields to override")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in out_dir from its last checkpoint"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from aiayn.training.recipe import load_recipe
    from aiayn.training.trainer import Trainer

    recipe, overrides = args.recipe, list(args.overrides)
    if recipe is not None and "=" in recipe and not Path(recipe).exists():
        recipe, overrides = None, [recipe, *overrides]
    cfg = load_recipe(recipe, overrides)
    trainer = Trainer(cfg, resume=args.resume)  # a mistake in the data or config stops here, said alone
    if cfg.warmup > cfg.max_steps and trainer.dist.is_main:  # cosine refuses it (config.py)
        said = f"warmup={cfg.warmup} is more than max_steps={cfg.max_steps}: the learning rate rises"
        print(
            f"aiayn train: {said} for the whole run and never reaches its peak (lower warmup)",
            file=sys.stderr,
        )
    reason = trainer.fit()["reason"]
    # stopped by a signal (saved, resumable): the shell's 128 + its number, so that `&&` and a
    # scheduler see an interrupted run, not a finished one
    return {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM}.get(reason, 0)
