"""``aiayn fill-mask``: the most probable words at each ``<mask>`` of a sentence (masked LM)."""

from __future__ import annotations

import argparse
import json

from aiayn.cli.commands import summary
from aiayn.cli.decode_options import add_model_argument, formatter, quantized
from aiayn.decoding.classifier import MaskFiller

EXAMPLES = """examples:
  aiayn fill-mask --model runs/mlm-multi30k "Ein Mann <mask> Fahrrad."
  aiayn fill-mask --model runs/mlm-multi30k --top-k 3 --json "A dog <mask> in the <mask> ."

For each <mask>, in order, the --top-k pieces with their probabilities and the sentence filled
with each. A space before <mask> belongs to the word that fills it.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fill-mask",
        help=summary("fill-mask"),
        description="Predict the words hidden by <mask> in a sentence (a model trained by task=mlm).",
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    add_model_argument(p)
    p.add_argument("text", help='a sentence with one or more "<mask>"')
    p.add_argument("--top-k", type=int, default=5, help="fillers per <mask> (default: 5)")
    p.add_argument("--json", action="store_true", help="print JSON: one list of fillers per <mask>")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    filler = quantized(args, MaskFiller.from_dir(args.model, args.device))
    masks = filler.fill(args.text, args.top_k)
    if args.json:
        print(json.dumps([[f.__dict__ for f in fillers] for fillers in masks], ensure_ascii=False, indent=1))
        return 0
    for i, fillers in enumerate(masks, start=1):
        if len(masks) > 1:
            print(f"<mask> {i}:")
        for f in fillers:
            print(f"{f.probability:.4f}\t{f.token!r}\t{f.sequence}")
    return 0
