"""Decoding time of a model trained with ``output_vocab="target"``: its head over the pieces against
the same weights scoring every id (``head.pieces`` removed), alternating, on Multi30k's validation
sources. Reported: seconds per pass for each beam size and the ratio.

    python benchmarks/output_vocab_decoding.py RUN_DIR --json results/bench-output-vocab-decoding.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from provenance import run_main, write_result

from aiayn.cli.demo import machine
from aiayn.data import load_parallel
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.translator import Translator
from aiayn.models.io import read_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a translation run (or model directory) trained with output_vocab=target")
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = Translator.from_dir(args.run)  # the model with its tokenizers
    model, src_tok, tgt_tok = loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer
    if model.head.pieces is None:
        raise SystemExit(f"{args.run}: this model scores every id; train it with output_vocab=target")
    meta = read_config(args.run)
    lines = [src for src, _ in load_parallel("multi30k", "valid", meta["src_lang"], meta["tgt_lang"])]
    every_id = copy.deepcopy(model)
    every_id.head.pieces = None  # the same weights, every id scored
    models = {"pieces": model, "every id": every_id}
    translators = {name: Translator(m, src_tok, tgt_tok) for name, m in models.items()}
    sources, _ = translators["pieces"].encode(lines)
    result = {"run": args.run, "sentences": len(lines), "pieces": model.head.pieces.numel(),
              "vocab": model.config.tgt_vocab_size,
              "machine": f"{machine()}, {args.threads} threads"}  # fmt: skip
    for translator in translators.values():  # warm-up: first-call costs timed in neither arm
        translator.search(sources[:64], SearchConfig(beam=max(args.beams)))
    for beam in args.beams:
        times: dict[str, list[float]] = {name: [] for name in translators}
        for _ in range(args.repeats):
            for name, translator in translators.items():  # alternate, so both see the same machine state
                t0 = time.perf_counter()
                translator.search(sources, SearchConfig(beam=beam))
                times[name].append(time.perf_counter() - t0)
        med = {name: round(statistics.median(t), 2) for name, t in times.items()}
        result[f"beam{beam}"] = {"seconds": med, "speedup": round(med["every id"] / med["pieces"], 2)}
        print(json.dumps({f"beam{beam}": result[f"beam{beam}"]}), flush=True)
    if args.json:
        write_result(args.json, result)  # temp file + rename: nothing half-written


if __name__ == "__main__":
    run_main(main)
