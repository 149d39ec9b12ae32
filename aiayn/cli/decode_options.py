"""Options that every decoding command shares (``--beam``, ``--sample``, …), and a few helpers.

``add_search_arguments(parser)`` adds them; ``search_config(args)`` turns them into a checked
``SearchConfig``. ``warn`` prints a one-line warning on stderr; ``check_outputs`` applies the
output-safety rule (``aiayn.atomic.check_output``) to a decoding command's output files.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import BinaryIO, TypeVar

from aiayn.atomic import check_output, write_text
from aiayn.decoding.mbr import UTILITIES
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.translator import DEFAULT_MAX_TOKENS
from aiayn.errors import DataError, OutputError
from aiayn.models.io import resolve_model_dir
from aiayn.models.quantize import QUANTIZATIONS, quantize

T = TypeVar("T")


def add_model_argument(p: argparse.ArgumentParser, quantize: bool = True) -> None:
    p.add_argument(
        "--model", required=True, metavar="DIR", help="model directory (config.json, weights, tokenizer)"
    )
    p.add_argument("--device", default="cpu", help="torch device to run on (default: cpu)")
    if quantize:
        add_quantize_argument(p)


def add_ensemble_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ensemble-with", metavar="DIR", nargs="+", default=[],
        help="decode with the mean of these models' next-token probabilities and --model's (e.g. a run's "
        "last checkpoints, runs/x/step-*; trained with the same tokenizers)",
    )  # fmt: skip


def add_quantize_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quantize", choices=QUANTIZATIONS, default="none",
        help="int8: dynamic int8 quantization of every linear layer; pays at larger sizes (default: none)",
    )  # fmt: skip


def quantized(args: argparse.Namespace, runner: T) -> T:
    """``runner`` (a Translator, Generator, …) with its model quantized as ``--quantize`` asks."""
    quantize(runner.model, args.quantize)
    return runner


def add_io_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """``--input FILE`` (default stdin) and ``--output FILE`` (default stdout), one line per text."""
    p.add_argument("--input", metavar="FILE", help="read texts from FILE, one per line (default: stdin)")
    p.add_argument("--output", metavar="FILE", help=f"write {what} to FILE (default: stdout)")


def read_lines(stream: BinaryIO, name: str) -> list[str]:
    """The lines of a UTF-8 byte stream, split on "\\n" only (a "\\r" before it is dropped)."""
    lines = []
    for i, raw in enumerate(stream.read().split(b"\n"), start=1):
        try:
            lines.append(raw.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as e:
            raise DataError(f"{name}: line {i} is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if lines and lines[-1] == "":  # the newline that ends the last line starts no new line
        lines.pop()
    return lines


def read_input(args: argparse.Namespace) -> list[str]:
    """The lines of ``--input``, or of stdin."""
    if args.input:
        with open(args.input, "rb") as f:
            return read_lines(f, args.input)
    return read_lines(sys.stdin.buffer, "<stdin>")


def write_output(args: argparse.Namespace, text: str) -> None:
    """``text`` to ``--output`` (atomically), or to stdout."""
    if args.output:
        write_text(args.output, text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


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
    g.add_argument("--r2l-beam", type=int, default=None,
                   help="bidirectional model: beam of its right-to-left pass (default: --beam)")  # fmt: skip
    g.add_argument("--mbr", choices=UTILITIES, default=None,
                   help="minimum Bayes risk: the beam's hypothesis with the highest expected BLEU (or chrF) "
                   "against the others; try --beam 10")  # fmt: skip
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


def check_outputs(args: argparse.Namespace, *options: str, inputs: tuple = ()) -> None:
    """Before any work: no output option may overwrite an input (the model's own files included)
    or another output of the same command."""
    model = resolve_model_dir(args.model) if Path(args.model).is_dir() else None
    seen: dict[Path, str] = {}
    for option in options:
        path = getattr(args, option.lstrip("-").replace("-", "_"))
        if path is None:
            continue
        check_output(path, (*inputs, model), option=option)
        if (same := seen.get(Path(path).resolve())) is not None:
            raise OutputError(f"{option} and {same} name the same file ({path}); give each its own")
        seen[Path(path).resolve()] = option


def warn(message: str) -> None:
    print(f"aiayn: warning: {message}", file=sys.stderr)


def formatter(prog: str) -> argparse.HelpFormatter:
    """Keeps the examples in an epilog as written."""
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)
