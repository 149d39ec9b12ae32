"""``aiayn translate``: translate lines of text with a model directory, as a pipe or on files."""

from __future__ import annotations

import argparse
import dataclasses

from aiayn.cli.decode_options import (
    add_ensemble_argument,
    add_io_arguments,
    add_model_argument,
    add_search_arguments,
    check_outputs,
    formatter,
    quantized,
    read_input,
    search_config,
    warn,
    write_output,
)
from aiayn.decoding.rerank import check_rerankable, rerank
from aiayn.decoding.translator import DEFAULT_MAX_SRC_LEN, Translator
from aiayn.errors import ConfigError

EXAMPLES = """examples:
  echo "Ein Mann fährt Fahrrad." | aiayn translate --model runs/de-en
  aiayn translate --model runs/de-en --input test.de --output test.hyp.en --beam 5 --lenpen 1.0
  aiayn translate --model runs/de-en --input test.de --nbest 4        # Moses n-best: i ||| text ||| score
  aiayn translate --model runs/de-en --sample --top-p 0.9 --seed 1 < test.de
  aiayn translate --model runs/de-en --beam 8 --rerank-with runs/de-en-r2l < test.de   # n-best reranking
  aiayn translate --model runs/de-en --beam 10 --mbr bleu < test.de   # minimum Bayes risk over the beam
  aiayn translate --model runs/de-en --ensemble-with runs/de-en-seed2 < test.de   # an ensemble of two

Output line i is the translation of input line i; a blank input line gives a blank output line.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "translate",
        help="translate text with a trained model",
        description="Translate lines of text, as a pipe or on files.",
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    add_model_argument(p)
    add_io_arguments(p, "translations")
    p.add_argument(
        "--max-src-len",
        type=int,
        default=None,
        help="source tokens at most, eos included; longer lines are truncated (default: the "
        f"model's max_len for learned positions, else {DEFAULT_MAX_SRC_LEN})",
    )
    p.add_argument(
        "--strict", action="store_true", help="a line over --max-src-len is an error, not a warning"
    )
    add_ensemble_argument(p)
    p.add_argument(
        "--rerank-with",
        metavar="DIR",
        help="re-sort the beam's n-best by this model's score too (e.g. a reverse_target=true model)",
    )
    add_search_arguments(p)
    p.set_defaults(run=run)


def format_output(nbest: list[list], translator: Translator, n: int) -> str:
    """One line per input, or with ``n > 1`` Moses n-best lines ``i ||| text ||| score``."""
    if n == 1:
        lines = [translator.detokenize(h[0]) if h else "" for h in nbest]
    else:
        lines = [
            f"{i} ||| {translator.detokenize(h)} ||| {h.score:.4f}" if h else f"{i} |||  ||| 0"
            for i, hyps in enumerate(nbest)
            for h in (hyps or [None])
        ]
    return "".join(line + "\n" for line in lines)


def run(args: argparse.Namespace) -> int:
    config = search_config(args)
    check_outputs(args, "--output", inputs=(args.input,))
    translator = Translator.from_dirs([args.model, *args.ensemble_with], args.device, args.max_src_len)
    translator = quantized(args, translator)
    lines = read_input(args)
    sources, cut = translator.encode(lines, strict=args.strict)
    for i in cut:
        warn(f"line {i + 1} is over {translator.max_src_len} source tokens; truncated (see --max-src-len)")
    if args.rerank_with:
        if config.mbr:
            raise ConfigError("--rerank-with and --mbr both choose among a beam's n-best: give one of them")
        if config.sample or config.beam < 2:
            raise ConfigError(
                "--rerank-with re-sorts a beam's n-best: give --beam 2 or more (and no --sample)"
            )
        scorer = quantized(args, Translator.from_dir(args.rerank_with, args.device, args.max_src_len))
        check_rerankable(translator, scorer)
        nbest = translator.search(sources, dataclasses.replace(config, nbest=config.beam), args.max_tokens)
        results = [hyps[: config.nbest] for hyps in rerank(translator, scorer, sources, nbest, config)]
    else:
        results = translator.search(sources, config, args.max_tokens)
    write_output(args, format_output(results, translator, config.nbest))
    return 0
