"""``aiayn translate``: translate lines of text with a model directory, as a pipe or on files."""

from __future__ import annotations

import argparse
from collections import Counter

from aiayn.atomic import open_output
from aiayn.cli.commands import summary
from aiayn.cli.decode_options import (
    add_ensemble_argument,
    add_io_arguments,
    add_model_argument,
    add_rerank_argument,
    add_search_arguments,
    check_bidirectional_options,
    check_outputs,
    formatter,
    quantized,
    read_chunks,
    search_config,
    warn,
)
from aiayn.decoding.rerank import check_rerank_search, check_rerankable, reranked_search
from aiayn.decoding.sampling import occurrences
from aiayn.decoding.translator import DEFAULT_MAX_SRC_LEN, Translator
from aiayn.errors import DataError

EXAMPLES = """examples:
  echo "Ein Mann fährt Fahrrad." | aiayn translate --model runs/de-en
  aiayn translate --model runs/de-en --input test.de --output test.hyp.en --beam 5 --lenpen 1.0
  aiayn translate --model runs/de-en --input test.de --nbest 4        # Moses n-best: i ||| text ||| score
  aiayn translate --model runs/de-en --sample --top-p 0.9 --seed 1 < test.de
  aiayn translate --model runs/de-en --beam 8 --rerank-with runs/de-en-r2l < test.de   # n-best reranking
  aiayn translate --model runs/de-en --beam 10 --mbr bleu < test.de   # minimum Bayes risk over the beam
  aiayn translate --model runs/de-en --ensemble-with runs/de-en-seed2 < test.de   # an ensemble of two
  aiayn translate --model runs/de-en-bidir --show-r2l < test.de   # text TAB the right-to-left pass's text

Output line i is the translation of input line i; a blank input line gives a blank output line.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "translate",
        help=summary("translate"),
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
    add_rerank_argument(p)
    p.add_argument(
        "--show-r2l",
        action="store_true",
        help="a bidirectional model: after each translation (a tab; with --nbest, one more ' ||| ' "
        "field), the right-to-left decoder's translation whose states it read",
    )
    add_search_arguments(p)
    p.set_defaults(run=run)


def format_output(
    nbest: list[list], translator: Translator, n: int, start: int = 0, r2l: bool = False
) -> str:
    """One line per input, or with ``n > 1`` Moses n-best lines ``i ||| text ||| score`` (``i``
    counted from ``start``); with ``r2l``, each followed by the right-to-left translation the
    hypothesis read (after a tab, or as one more ``|||`` field)."""
    if n == 1:
        rows = [(translator.detokenize(h[0]), h[0]) if h else ("", None) for h in nbest]
    else:
        rows = [
            (f"{i} ||| {translator.detokenize(h)} ||| {h.score:.4f}" if h else f"{i} |||  ||| 0", h)
            for i, hyps in enumerate(nbest, start)
            for h in (hyps or [None])
        ]
    if not r2l:
        return "".join(line + "\n" for line, _ in rows)
    sep = "\t" if n == 1 else " ||| "
    return "".join(f"{line}{sep}{translator.detokenize_r2l(h) if h else ''}\n" for line, h in rows)


def run(args: argparse.Namespace) -> int:
    config = search_config(args)
    check_outputs(args, "--output")
    if args.rerank_with:
        check_rerank_search(config)
    translator = Translator.from_dirs([args.model, *args.ensemble_with], args.device, args.max_src_len)
    translator = quantized(args, translator)
    check_bidirectional_options(args, translator)
    scorer = None
    if args.rerank_with:
        scorer = quantized(args, Translator.from_dir(args.rerank_with, args.device, args.max_src_len))
        check_rerankable(translator, scorer)
    seeded = config.sample and config.seed is not None
    seen = Counter() if seeded else None  # with --seed, a line repeated anywhere in the file: new samples
    with open_output(args.output) as out:  # a file appears whole once every chunk is written
        for start, lines in read_chunks(args):
            nbest = translate(args, config, translator, scorer, start, lines, seen)
            out.write(format_output(nbest, translator, config.nbest, start, args.show_r2l).encode("utf-8"))
    return 0


def translate(args, config, translator: Translator, scorer: Translator | None, start: int, lines: list[str],
              seen: Counter | None = None):  # fmt: skip
    """The hypotheses of one chunk of input lines, the first of which is line ``start + 1`` (with
    ``--seed``, each line's samples are its own and its earlier copies', counted in ``seen``:
    ``Translator.search``)."""
    sources, cut = translator.encode(lines)
    for i in cut:
        if args.strict:
            n = len(translator.src_tokenizer.encode_batch([lines[i]])[0]) + 1
            raise DataError(
                f"{args.input or '<stdin>'}: line {start + i + 1} has {n} source tokens, over the maximum "
                f"of {translator.max_src_len} (--max-src-len); shorten it, or drop --strict to truncate it"
            )
        limit = translator.max_src_len
        warn(f"line {start + i + 1} is over {limit} source tokens; truncated (see --max-src-len)")
    if scorer is None:
        repeats = occurrences(sources, seen) if seen is not None else None
        return translator.search(sources, config, args.max_tokens, repeats)
    return reranked_search(translator, scorer, sources, config, args.max_tokens)
