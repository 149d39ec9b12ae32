"""``aiayn classify``: label lines of text with a fine-tuned encoder, as a pipe or on files."""

from __future__ import annotations

import argparse
import json

from aiayn.atomic import open_output
from aiayn.cli.decode_options import (
    add_io_arguments,
    add_model_argument,
    check_outputs,
    formatter,
    quantized,
    read_chunks,
)
from aiayn.decoding.classifier import DEFAULT_MAX_TOKENS, TextClassifier

EXAMPLES = """examples:
  echo "a gorgeous , witty , seductive movie ." | aiayn classify --model runs/sst2-finetune
  aiayn classify --model runs/sst2-finetune --input reviews.txt --output labels.txt
  aiayn classify --model runs/sst2-finetune --top-k 2 --json < reviews.txt

Output line i is for input line i: "label<TAB>probability" (with --top-k, k such pairs, most
probable first); with --json one object per line: {"labels": [...], "probabilities": [...]}.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "classify",
        help="label text with a fine-tuned encoder",
        description="Label lines of text (sentiment, topic, …) with a model trained by task=classify.",
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    add_model_argument(p)
    add_io_arguments(p, "labels")
    p.add_argument("--top-k", type=int, default=1, help="labels per line, most probable first (default: 1)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    tokens = f"tokens per batch, padding included (default: {DEFAULT_MAX_TOKENS})"
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help=tokens)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_outputs(args, "--output")
    classifier = quantized(args, TextClassifier.from_dir(args.model, args.device))
    with open_output(args.output) as out:  # a file appears whole once every chunk is written
        for _, lines in read_chunks(args):
            results = classifier.predict(lines, args.top_k, args.max_tokens)
            if args.json:
                rows = [json.dumps({"labels": [y for y, _ in r],
                                    "probabilities": [round(q, 6) for _, q in r]},
                        ensure_ascii=False) for r in results]  # fmt: skip
            else:
                rows = ["\t".join(f"{y}\t{p:.4f}" for y, p in r) for r in results]
            out.write("".join(row + "\n" for row in rows).encode("utf-8"))
    return 0
