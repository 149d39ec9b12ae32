"""A running search in process, as ``aiayn serve --scheduling step`` drives it, without HTTP.

Closed loop over Multi30k test2016 sources: ``C`` sentences stay in flight; when one is done, the next
joins before the following step (``RunningSearch.add``), as a server's next request would. Reports
sentences/s, p50/p99 latency (from joining to done) and decoding steps for each ``C`` (the median of
``--repeats`` rounds by sentences/s, with every round's sentences/s and p99 beside it: the best round's
p99 would be the luckiest tail, not the typical one), and checks that every sentence's tokens are the
same at every ``C`` (each decodes as it would alone). With ``--phases`` it also times the parts of a
step (the encoder pass of new sentences, joining, the decoder layers, the head, reordering the cache,
sentences leaving).

The server adds HTTP, tokenization and the clients on the same cores (``benchmarks/serve_load.py``);
this is the decoding side alone, the part that scheduling changes.

    python benchmarks/running_search.py --model runs/demo --in-flight 1 16 --json results/running-search.json
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from provenance import run_main, write_result  # noqa: E402

from aiayn.cli.demo import machine  # noqa: E402
from aiayn.data.corpus import load_parallel  # noqa: E402
from aiayn.decoding import adapters, beam, running  # noqa: E402
from aiayn.decoding.options import SearchConfig  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402

PHASES = [  # (class, method, label): what --phases times
    (running.RunningSearch, "add", "add: encode, prime, join"),
    (adapters.Seq2SeqAdapter, "start", "  encoder pass"),
    (beam.Beams, "join", "  join"),
    (running.RunningSearch, "step", "step"),
    (adapters.Seq2SeqAdapter, "_hidden", "  decoder layers"),
    (adapters.IncrementalDecoder, "step", "  decoder layers + head"),
    (adapters.IncrementalDecoder, "reorder", "  reorder (beams)"),
    (beam.Beams, "_keep", "  sentences leave"),
]


def closed_loop(translator: Translator, sources: list[list[int]], in_flight: int, config: SearchConfig):
    """Decode ``sources`` with ``in_flight`` of them in the running search at every step."""
    search = running.RunningSearch(translator.model, config)
    started, latency, tokens, steps, following = {}, [], {}, 0, 0
    t0 = time.perf_counter()
    while following < len(sources) or len(search):
        new = list(range(following, min(len(sources), following + in_flight - len(search))))
        following += len(new)
        if new:
            src, limits = translator.batch([sources[i] for i in new], config)
            now = time.perf_counter()
            started.update((i, now) for i in new)
            search.add(src, limits, new)
        for i, hyps in search.step():
            latency.append(time.perf_counter() - started[i])
            tokens[i] = hyps[0].tokens
        steps += 1
    wall = time.perf_counter() - t0
    latency.sort()
    return {"in_flight": in_flight, "sentences_per_s": round(len(sources) / wall, 2),
            "p50_ms": round(1000 * latency[len(latency) // 2], 1),
            "p99_ms": round(1000 * latency[min(len(latency) - 1, int(0.99 * len(latency)))], 1),
            "steps": steps, "seconds": round(wall, 3)}, tokens  # fmt: skip


def timed_phases() -> collections.Counter:
    """Wrap the methods of ``PHASES`` so that their wall-clock time adds up in the returned counter."""
    spent = collections.Counter()
    for cls, name, label in PHASES:
        method = getattr(cls, name)

        @functools.wraps(method)
        def timed(*args, _method=method, _label=label, **kwargs):
            t0 = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[_label] += time.perf_counter() - t0

        setattr(cls, name, timed)
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a translation model directory (de→en on Multi30k)")
    ap.add_argument("--in-flight", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--sentences", type=int, default=160)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--phases", action="store_true", help="also time the parts of a step (a little slower)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if min(args.sentences, args.beam, args.repeats, args.threads, *args.in_flight) < 1:
        ap.error("--sentences, --beam, --repeats, --threads and each --in-flight must be at least 1")
    torch.set_num_threads(args.threads)
    translator = Translator.from_dir(args.model)
    texts = [src for src, _ in load_parallel("multi30k", "test", "de", "en")][: args.sentences]
    sources, _ = translator.encode(texts)
    config = SearchConfig(beam=args.beam)
    spent = timed_phases() if args.phases else None
    closed_loop(translator, sources[:32], 4, config)  # warm-up
    rows, outputs = [], []
    for n in args.in_flight:
        rounds = []
        for _ in range(args.repeats):
            if spent is not None:
                spent.clear()
            row, tokens = closed_loop(translator, sources, n, config)
            if spent is not None:
                row["phases_ms_per_step"] = {k: round(1000 * v / row["steps"], 2) for k, v in spent.items()}
            rounds.append(row)
        middle = sorted(rounds, key=lambda r: r["sentences_per_s"])[(len(rounds) - 1) // 2]
        middle["all_sentences_per_s"] = [r["sentences_per_s"] for r in rounds]
        middle["all_p99_ms"] = [r["p99_ms"] for r in rounds]
        rows.append(middle)
        outputs.append(tokens)
        print(json.dumps(middle), flush=True)
    same = all(o == outputs[0] for o in outputs)
    print(f"same tokens at every in-flight count: {same}")
    if args.json:
        write_result(args.json, {"machine": machine(), "model": args.model, "beam": args.beam,
                               "sentences": len(sources), "threads": args.threads, "runs": rows,
                               "same_tokens": same, "command": " ".join(sys.argv)})  # fmt: skip


if __name__ == "__main__":
    run_main(main)
