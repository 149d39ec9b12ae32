"""``aiayn classify``: label lines of text with a fine-tuned encoder, as a pipe or on files."""

from __future__ import annotations

import argparse
import json

from aiayn.atomic import open_output
from aiayn.cli.commands import summary
from aiayn.cli.decode_options import (
    add_ensemble_argument,
    add_io_arguments,
    add_model_argument,
    check_outputs,
    formatter,
    quantized,
    read_chunks,
)
from aiayn.data.long_text import POLICIES, LongText
from aiayn.decoding.classifier import DEFAULT_MAX_TOKENS, load_classifier
from aiayn.errors import ConfigError

EXAMPLES = """examples:
  echo "a gorgeous , witty , seductive movie ." | aiayn classify --model runs/sst2-finetune
  aiayn classify --model runs/sst2-finetune --input reviews.txt --output labels.txt
  aiayn classify --model runs/sst2-finetune --top-k 2 --json < reviews.txt
  aiayn classify --model runs/sst2-seed1 --ensemble-with runs/sst2-seed2 < reviews.txt   # two as one

Output line i is for input line i: "label<TAB>probability" (with --top-k, k such pairs, most
probable first); with --json one object per line: {"labels": [...], "probabilities": [...]}.
A blank input line gives a blank output line (no labels, in JSON empty lists): it is no text to label.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "classify",
        help=summary("classify"),
        description="Label lines of text (sentiment, topic, …) with a model trained by task=classify.",
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    add_model_argument(p)
    add_ensemble_argument(p, ENSEMBLE_HELP)
    add_io_arguments(p, "labels")
    p.add_argument("--top-k", type=int, default=1, help="labels per line, most probable first (default: 1)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    tokens = f"tokens per batch, padding included (default: {DEFAULT_MAX_TOKENS})"
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help=tokens)
    add_long_text_arguments(p)
    p.set_defaults(run=run)


ENSEMBLE_HELP = ("label with the mean of these classifiers' class probabilities and --model's (e.g. "
                 "fine-tuned with other seeds; the same labels, any tokenizers)")  # fmt: skip


def add_long_text_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--long-text",
        choices=POLICIES,
        help="how to read a text longer than the model's max_len (default: as in training)",
    )
    p.add_argument(
        "--window-stride",
        type=int,
        default=0,
        help="with --long-text windows: pieces between window starts (default: half a window)",
    )


def long_text_of(args: argparse.Namespace) -> LongText | None:
    """The ``--long-text`` policy, or None for the one saved with the model."""
    if args.long_text is None:
        if args.window_stride:
            raise ConfigError("--window-stride is for --long-text windows; add it or drop --window-stride")
        return None
    if args.window_stride and args.long_text != "windows":
        raise ConfigError(f"--window-stride is for --long-text windows, not {args.long_text}")
    return LongText(args.long_text, args.window_stride)


def run(args: argparse.Namespace) -> int:
    check_outputs(args, "--output")
    directories = [args.model, *args.ensemble_with]
    classifier = quantized(args, load_classifier(directories, args.device, long_text_of(args)))
    with open_output(args.output) as out:  # a file appears whole once every chunk is written
        for _, lines in read_chunks(args):
            texts = [line for line in lines if line.strip()]  # a blank line: nothing to label
            labelled = iter(classifier.predict(texts, args.top_k, args.max_tokens))
            results = [next(labelled) if line.strip() else [] for line in lines]
            if args.json:
                rows = [json.dumps({"labels": [y for y, _ in r],
                                    "probabilities": [round(q, 6) for _, q in r]},
                        ensure_ascii=False) for r in results]  # fmt: skip
            else:
                rows = ["\t".join(f"{y}\t{p:.4f}" for y, p in r) for r in results]
            out.write("".join(row + "\n" for row in rows).encode("utf-8"))
    return 0
