"""Is a ``torch.compile``d decoding step faster than the eager one?

The decoder's incremental step (``Seq2SeqAdapter._hidden``: the decoder layers for one new token per
row, with the KV cache) run eagerly and through ``torch.compile(dynamic=True)`` (inductor, C++ on the
CPU), at 4 rows (one sentence, beam 4) and 64 rows (16 sentences): the time of the first 10 steps (the
compilation, for the compiled step) and then the mean time of a step over the next ``--steps``, the
cache growing by one position each step as in a search. Reports the recompilations dynamo made
(a changing cache length or row count is a new guard unless the shape is symbolic).

``--fixed`` measures the ceiling a static cache could reach instead: every step runs at the same
shapes (4 rows, the cache held at the length of its tenth position: each step's new keys and values
are dropped again), eagerly, through ``torch.compile(dynamic=False)``, and through it with inductor's
C++ wrapper (``torch._inductor.config.cpp_wrapper``, which calls the generated kernels from C++
instead of Python). Each compiled variant runs in a process of its own, so that one's compiled code
and settings do not leak into the other's.

    python benchmarks/compiled_step.py --model runs/demo --json results/compiled-step.json
    python benchmarks/compiled_step.py --model runs/demo --fixed --json results/compiled-step-fixed.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
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


def extended(adapter: Seq2SeqAdapter, prefix: torch.Tensor) -> torch.Tensor:
    """``prefix`` with every row's most probable next token appended (one decoding step)."""
    return torch.cat([prefix, adapter.step(prefix).argmax(-1, keepdim=True)], 1)


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
            prefix = extended(adapter, prefix)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(steps):
            prefix = extended(adapter, prefix)
        per_step = (time.perf_counter() - t0) / steps
    return {"rows": 4 * sentences, "compiled": compiled is not None, "first_10_steps_s": round(first, 2),
            "ms_per_step": round(1000 * per_step, 2)}  # fmt: skip


FIXED_MODES = ("eager", "compiled", "compiled-cpp-wrapper")


def run_fixed(model, mode: str, steps: int, seed: int = 0) -> dict:
    """One sentence, beam 4: ten steps, then ``steps`` more at the same shapes (the cache's length
    reset after each one); the first compiled call's time and the best mean of five passes."""
    if mode == "compiled-cpp-wrapper":
        import torch._inductor.config as inductor_config

        inductor_config.cpp_wrapper = True
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, model.config.src_vocab_size, (1, 12), generator=g)
    with torch.inference_mode():
        adapter = Seq2SeqAdapter(model)
        prefix = adapter.start(src, 4)
        for _ in range(10):
            prefix = extended(adapter, prefix)
        caches = [slots["self"] for slots in adapter.cache.layers]
        length = len(caches[0])

        def step() -> None:
            adapter.step(prefix)
            for cache in caches:
                cache._len = length  # the step's own keys and values are dropped: same shapes next time

        if mode != "eager":
            adapter._hidden = torch.compile(adapter._hidden, dynamic=False)
        t0 = time.perf_counter()
        step()
        first = time.perf_counter() - t0
        for _ in range(20):
            step()
        passes = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            passes.append((time.perf_counter() - t0) / steps)
    return {"mode": mode, "rows": 4, "cache_length": length, "first_call_s": round(first, 2),
            "ms_per_step": round(1000 * min(passes), 3)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a translation model directory")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fixed", action="store_true", help="every step at the same shapes (see above)")
    ap.add_argument("--mode", choices=FIXED_MODES, help=argparse.SUPPRESS)  # --fixed's worker
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.fixed and args.mode is None:  # one process per mode
        base = [sys.executable, __file__, "--model", args.model, "--threads", str(args.threads),
                "--steps", str(args.steps), "--fixed", "--mode"]  # fmt: skip
        rows = []
        for mode in FIXED_MODES:
            out = subprocess.run([*base, mode], check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
        write(args, fixed_shapes=rows)
        return
    model = Translator.from_dir(args.model).model.eval()
    if args.mode is not None:
        print(json.dumps(run_fixed(model, args.mode, args.steps)))
        return
    compiled = torch.compile(dynamic=True)
    rows = []
    for sentences in (1, 16):
        for c in (None, compiled):
            rows.append(run(model, sentences, c, args.steps))
            print(json.dumps(rows[-1]), flush=True)
    counters = {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if k in ("stats", "recompiles")}
    print(json.dumps(counters))
    write(args, runs=rows, dynamo=counters)


def write(args: argparse.Namespace, **results) -> None:
    """``results`` with the machine and the command at ``--json``, when given."""
    if args.json:
        write_result(args.json, {"machine": machine(), "model": args.model, "threads": args.threads,
                                 "torch": torch.__version__, **results,
                                 "command": " ".join(sys.argv)})  # fmt: skip


if __name__ == "__main__":
    run_main(main)
