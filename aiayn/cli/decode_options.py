"""Options that every decoding command shares (``--beam``, ``--sample``, …), and a few helpers.

``add_search_arguments(parser)`` adds them; ``search_config(args)`` turns them into a checked
``SearchConfig``. ``warn`` prints a one-line warning on stderr; ``write_text_atomic`` writes an
output file under a temporary name and renames it, so a failed run never leaves half a file.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from aiayn.decoding.options import SearchConfig
from aiayn.decoding.translator import DEFAULT_MAX_TOKENS


def add_model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, metavar="DIR", help="model directory (config.json, weights, tokenizer)"
    )
    p.add_argument("--device", default="cpu", help="torch device to run on (default: cpu)")


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    d = SearchConfig()
    g = p.add_argument_group("search")
    g.add_argument("--beam", type=int, default=d.beam, help=f"beam size; 1 = greedy (default: {d.beam})")
    g.add_argument("--nbest", type=int, default=d.nbest, help="hypotheses (or samples) per sentence")
    g.add_argument("--lenpen", type=float, default=d.lenpen, help=f"length penalty α (default: {d.lenpen})")
    kinds = ["gnmt", "simple"]
    g.add_argument(
        "--lenpen-kind", choices=kinds, default=d.lenpen_kind, help="gnmt: ((5+|Y|)/6)^α; simple: |Y|^α"
    )
    g.add_argument("--max-len", type=int, default=None, help="output tokens at most (default: source + 50)")
    g.add_argument("--max-len-b", type=int, default=d.max_len_b, help="the + 50 of the default --max-len")
    g.add_argument("--min-len", type=int, default=0, help="no eos before this many output tokens")
    tokens = f"source tokens per batch, padding included (default: {DEFAULT_MAX_TOKENS})"
    g.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help=tokens)
    g.add_argument("--no-cache", action="store_true", help="recompute the prefix each step (slow; a check)")
    s = p.add_argument_group("sampling")
    s.add_argument("--sample", action="store_true", help="sample instead of beam search")
    s.add_argument("--temperature", type=float, default=1.0, help="divide log-probs by T (default: 1)")
    s.add_argument("--top-k", type=int, default=None, help="sample among the k most probable tokens")
    s.add_argument("--top-p", type=float, default=None, help="sample within the top-p probability nucleus")
    s.add_argument("--seed", type=int, default=None, help="random seed for sampling")


def search_config(args: argparse.Namespace) -> SearchConfig:
    """The ``SearchConfig`` of the options ``add_search_arguments`` added (same names)."""
    names = [f.name for f in dataclasses.fields(SearchConfig)]
    options = {name: getattr(args, name) for name in names if hasattr(args, name)}
    return SearchConfig(**options, use_cache=not args.no_cache)


def warn(message: str) -> None:
    print(f"aiayn: warning: {message}", file=sys.stderr)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` via a temporary file in the same folder and a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def formatter(prog: str) -> argparse.HelpFormatter:
    """Keeps the examples in an epilog as written."""
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)
