"""Is a ``torch.compile``d decoding step faster than the eager one?

The decoder's incremental step (``Seq2SeqAdapter._hidden``: the decoder layers for one new token per
row, with the KV cache) run eagerly and through ``torch.compile(dynamic=True)`` (inductor, C++ on the
CPU), at 4 rows (one sentence, beam 4) and 64 rows (16 sentences): the time of the first 10 steps (the
compilation, for the compiled step) and then the mean time of a step over the next ``--steps``, the
cache growing by one position each step as in a search. Reports the recompilations dynamo made
(a changing cache length or row count is a new guard unless the shape is symbolic).

    python benchmarks/compiled_step.py --model runs/demo --json results/compiled-step.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from provenance import run_main, write_result  # noqa: E402

from aiayn.cli.demo import machine  # noqa: E402
from aiayn.decoding.adapters import Seq2SeqAdapter  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402


def run(model, sentences: int, compiled, steps: int, seed: int = 0) -> dict:
    """Greedy-extend 4 rows per random source sentence; time the first 10 steps and the next ``steps``."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, model.config.src_vocab_size, (sentences, 12), generator=g)
    with torch.inference_mode():
        adapter = Seq2SeqAdapter(model)
        if compiled is not None:
            adapter._hidden = compiled(adapter._hidden)
        prefix = adapter.start(src, 4)
        t0 = time.perf_counter()
        for _ in range(10):
            prefix = torch.cat([prefix, adapter.step(prefix).argmax(-1, keepdim=True)], 1)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(steps):
            prefix = torch.cat([prefix, adapter.step(prefix).argmax(-1, keepdim=True)], 1)
        per_step = (time.perf_counter() - t0) / steps
    return {"rows": 4 * sentences, "compiled": compiled is not None, "first_10_steps_s": round(first, 2),
            "ms_per_step": round(1000 * per_step, 2)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a translation model directory")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = Translator.from_dir(args.model).model.eval()
    compiled = torch.compile(dynamic=True)
    rows = []
    for sentences in (1, 16):
        for c in (None, compiled):
            rows.append(run(model, sentences, c, args.steps))
            print(json.dumps(rows[-1]), flush=True)
    counters = {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if k in ("stats", "recompiles")}
    print(json.dumps(counters))
    if args.json:
        write_result(args.json, {"machine": machine(), "model": args.model, "threads": args.threads,
                               "torch": torch.__version__, "runs": rows, "dynamo": counters,
                               "command": " ".join(sys.argv)})  # fmt: skip


if __name__ == "__main__":
    run_main(main)
