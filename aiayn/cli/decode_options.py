"""Options that every decoding command shares (``--beam``, ``--sample``, …), and a few helpers.

``add_search_arguments(parser)`` adds them; ``search_config(args)`` turns them into a checked
``SearchConfig``. ``warn`` prints a one-line warning on stderr; ``check_outputs`` applies the
output-safety rule (``aiayn.outputs.check_output``) to a decoding command's output files, against
every path it reads (``command_inputs``); ``read_chunks`` streams its input, a chunk of lines at a
time, so no input is held whole.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import io
import itertools
import os
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from aiayn.data.files import BOM, GZIP_MAGIC, read_error
from aiayn.decoding.mbr import UTILITIES
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.translator import DEFAULT_MAX_TOKENS
from aiayn.errors import ConfigError, DataError, OutputError
from aiayn.models.io import resolve_model_dir
from aiayn.models.prepack import GEMMS, prepack
from aiayn.models.quantize import QUANTIZATIONS, quantize
from aiayn.outputs import check_output

T = TypeVar("T")


def add_model_argument(p: argparse.ArgumentParser, quantize: bool = True) -> None:
    p.add_argument(
        "--model", required=True, metavar="DIR", help="model directory (config.json, weights, tokenizer)"
    )
    p.add_argument("--device", default="cpu", help="torch device to run on (default: cpu)")
    if quantize:
        add_quantize_argument(p)


ENSEMBLE_HELP = ("decode with the mean of these models' next-token probabilities and --model's (e.g. a "
                 "run's last checkpoints, runs/x/step-*; trained with the same tokenizers)")  # fmt: skip


def add_ensemble_argument(p: argparse.ArgumentParser, help: str = ENSEMBLE_HELP) -> None:
    p.add_argument("--ensemble-with", metavar="DIR", nargs="+", default=[], help=help)


def add_rerank_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rerank-with", metavar="DIR",
        help="re-sort the beam's n-best by this model's score too (e.g. a reverse_target=true model)",
    )  # fmt: skip


def add_quantize_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quantize", choices=QUANTIZATIONS, default="none",
        help="int8: dynamic int8 quantization of every linear layer; pays at larger sizes. bf16: bfloat16 "
        "weights and activations; pays on CPUs with AVX512_BF16 or AMX (default: none)",
    )  # fmt: skip

    p.add_argument(
        "--gemm", choices=GEMMS, default="blas",
        help="float32 Linear kernels: blas (PyTorch's), onednn (weights prepacked for oneDNN: faster on "
        "CPUs where the BLAS is slow at decoding's shapes), auto (per shape, whichever a "
        "timing at load finds faster) (default: blas)",
    )  # fmt: skip


def check_bidirectional_options(args: argparse.Namespace, translator) -> None:
    """``--r2l-beam`` (and translate's ``--show-r2l``) read a bidirectional model's right-to-left
    pass: for another model they are a one-line error, not silently ignored."""
    if translator.model.config.bidirectional:
        return
    given = {"--r2l-beam": args.r2l_beam is not None, "--show-r2l": getattr(args, "show_r2l", False)}
    for flag in (f for f, on in given.items() if on):
        raise ConfigError(f"{flag}: {args.model} is not a bidirectional model (model.bidirectional=true); "
                          f"leave {flag} out")  # fmt: skip


def quantized(args: argparse.Namespace, runner: T) -> T:
    """``runner`` (a Translator, Generator, …) with its model quantized as ``--quantize`` asks and its
    Linear kernels chosen as ``--gemm`` asks."""
    quantize(runner.model, args.quantize)
    prepack(runner.model, args.gemm)
    return runner


def add_io_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """``--input FILE`` (default stdin) and ``--output FILE`` (default stdout), one line per text."""
    p.add_argument("--input", metavar="FILE", help="read texts from FILE, one per line (default or -: stdin)")
    p.add_argument("--output", metavar="FILE", help=f"write {what} to FILE (default or -: stdout)")


MAX_LINE_BYTES = 1 << 24  # an input line longer than this (16 MiB) is an error, not read into memory
CHUNK_LINES = 10_000  # lines decoded at a time: memory stays flat whatever the input size


def read_lines(stream: BinaryIO, name: str) -> Iterator[str]:
    """The lines of a UTF-8 byte stream, one at a time, split on "\\n" only (a "\\r" before it is
    dropped, as is a byte-order mark before the first); a line over ``MAX_LINE_BYTES`` is a
    ``DataError`` naming it, as is a broken gzip stream."""
    for i in itertools.count(1):
        try:
            raw = stream.readline(MAX_LINE_BYTES + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise read_error(name, e) from None
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise DataError(
                f"{name}: line {i} is longer than {MAX_LINE_BYTES} bytes (MAX_LINE_BYTES); is it a text "
                "file, one text per line?"
            )
        if i == 1:
            raw = raw.removeprefix(BOM)
        try:
            yield raw.removesuffix(b"\n").removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{name}: line {i} is not valid UTF-8 ({e.reason} at byte {e.start})") from None


def read_chunks(args: argparse.Namespace) -> Iterator[tuple[int, list[str]]]:
    """``(index of the first line, up to CHUNK_LINES lines)`` of ``--input`` (or stdin, also for ``-``),
    plain or gzipped (told by its first two bytes, peeked: a pipe works too, as data files read)."""
    with contextlib.ExitStack() as stack:
        if args.input and args.input != "-":
            stream, name = stack.enter_context(open(args.input, "rb")), args.input
        else:
            stream, name = sys.stdin.buffer, "<stdin>"
        if not hasattr(stream, "peek"):  # a stdin replaced by an in-memory stream
            stream = io.BufferedReader(stream)
        if stream.peek(len(GZIP_MAGIC))[: len(GZIP_MAGIC)] == GZIP_MAGIC:
            stream = stack.enter_context(io.BufferedReader(gzip.GzipFile(fileobj=stream, mode="rb")))
        lines = read_lines(stream, name)
        start = 0
        while chunk := list(itertools.islice(lines, CHUNK_LINES)):
            yield start, chunk
            start += len(chunk)


def command_inputs(args: argparse.Namespace, *more: str | os.PathLike | None) -> tuple[Path, ...]:
    """Every path a command reads, in one place: its model directories (as given and as resolved,
    a run's checkpoint), input files and references, and ``more`` (files a dataset name stood for).
    No output may overwrite one, nor a file already inside one (``check_output``)."""
    paths: list[Path] = []
    for option in INPUT_OPTIONS:
        value = getattr(args, option, None)
        for item in value if isinstance(value, list) else [value]:
            if item is None or str(item) == "-":
                continue
            paths.append(Path(item))
            if option in MODEL_OPTIONS and Path(item).is_dir():
                paths.append(resolve_model_dir(item))
    return (*paths, *(Path(m) for m in more if m is not None))


INPUT_OPTIONS = ("model", "ensemble_with", "rerank_with", "input", "src", "ref", "data")
MODEL_OPTIONS = ("model", "ensemble_with", "rerank_with")


def add_search_arguments(p: argparse.ArgumentParser, classifier_max_tokens: int | None = None) -> None:
    """The search's options; ``classifier_max_tokens``: the command also scores classifiers (evaluate),
    whose batches default to that many tokens (``--max-tokens`` is then None unless given)."""
    d = SearchConfig()
    g = p.add_argument_group("search")
    g.add_argument("--beam", type=int, default=None, help=f"beam size; 1 = greedy (default: {d.beam})")
    g.add_argument("--nbest", type=int, default=d.nbest, help="hypotheses (or samples) per sentence")
    g.add_argument("--lenpen", type=float, default=d.lenpen, help=f"length penalty α (default: {d.lenpen})")
    kinds = ["gnmt", "simple"]
    g.add_argument(
        "--lenpen-kind", choices=kinds, default=d.lenpen_kind, help="gnmt: ((5+|Y|)/6)^α; simple: |Y|^α"
    )
    g.add_argument(
        "--max-len", type=int, default=None, help="output tokens at most (default: source + 50, or --min-len)"
    )
    g.add_argument("--max-len-b", type=int, default=d.max_len_b, help="the + 50 of the default --max-len")
    g.add_argument("--min-len", type=int, default=0, help="no eos before this many output tokens")
    tokens = f"source tokens per batch, padding included (default: {DEFAULT_MAX_TOKENS}"
    if classifier_max_tokens is None:
        g.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help=tokens + ")")
    else:
        tokens += f"; a classifier's texts: {classifier_max_tokens})"
        g.add_argument("--max-tokens", type=int, default=None, help=tokens)
    g.add_argument("--no-cache", action="store_true", help="recompute the prefix each step (slow; a check)")
    g.add_argument("--r2l-beam", type=int, default=None,
                   help="bidirectional model: beam of its right-to-left pass (default: the beam its cached "
                        "memories were made with, recorded in the model; else --beam)")  # fmt: skip
    g.add_argument("--mbr", choices=UTILITIES, default=None,
                   help="minimum Bayes risk: the beam's hypothesis with the highest expected BLEU (or chrF) "
                   "against the others; try --beam 10")  # fmt: skip
    s = p.add_argument_group("sampling")
    s.add_argument("--sample", action="store_true", help="sample instead of beam search")
    s.add_argument(
        "--temperature", type=float, default=1.0, help="divide log-probs by T in [1e-4, 1e4] (default: 1)"
    )
    s.add_argument("--top-k", type=int, default=None, help="sample among the k most probable tokens")
    s.add_argument("--top-p", type=float, default=None, help="sample within the top-p probability nucleus")
    s.add_argument("--seed", type=int, default=None, help="random seed for sampling")


MAX_SAMPLES = 1024  # --nbest with --sample: a million rows ran out of memory


def search_config(args: argparse.Namespace) -> SearchConfig:
    """The ``SearchConfig`` of the options ``add_search_arguments`` added (same names)."""
    names = [f.name for f in dataclasses.fields(SearchConfig)]
    options = {name: getattr(args, name) for name in names if hasattr(args, name)}
    if options.get("beam") is None:  # not given: the default
        options.pop("beam", None)
    elif options.get("sample"):
        raise ConfigError(f"--beam {options['beam']} sizes a beam search, which --sample does not run "
                          "(it draws --nbest samples); leave one of them out")  # fmt: skip
    if options.get("sample") and options.get("nbest", 1) > MAX_SAMPLES:
        raise ConfigError(f"--nbest {options['nbest']}: --sample draws at most {MAX_SAMPLES} samples per "
                          "input (each a row decoded beside the others); run again with another --seed "
                          "for more")  # fmt: skip
    return SearchConfig(**options, use_cache=not args.no_cache)


def check_outputs(args: argparse.Namespace, *options: str, inputs: tuple = ()) -> None:
    """Before any work: no output option may overwrite an input (``command_inputs``: every model
    directory and file the command reads, and ``inputs``) or another output of the same command."""
    everything = command_inputs(args, *inputs)
    seen: dict[Path, str] = {}
    for option in options:
        path = getattr(args, option.lstrip("-").replace("-", "_"))
        if path is None or path == "-":
            continue
        check_output(path, everything, option=option)
        if (same := seen.get(Path(path).resolve())) is not None:
            raise OutputError(f"{option} and {same} name the same file ({path}); give each its own")
        seen[Path(path).resolve()] = option


def warn(message: str) -> None:
    print(f"aiayn: warning: {message}", file=sys.stderr)


def formatter(prog: str) -> argparse.HelpFormatter:
    """Keeps the examples in an epilog as written."""
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)
