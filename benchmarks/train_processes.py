"""CPU training throughput: one process with N threads against N single-thread processes (DDP).

A CPU's cores can train one model in two ways: intra-op threads inside one process (PyTorch's
default), or ``torchrun --nproc_per_node=N`` with one thread per process, DistributedDataParallel
averaging the gradients over gloo. For a small model the second keeps every core busy through the
Python, optimizer and small-kernel stretches that threads cannot split. This runs ``aiayn train``
on a real recipe for a few updates in each layout, one after the other, and reports target tokens/s
(median over the logged windows after the first ``--skip`` updates, and over all those updates
together: the median leaves out the few slow windows of long sentences), updates/s and tokens per
update.

    python benchmarks/train_processes.py                       # Multi30k recipe, 2 cores
    python benchmarks/train_processes.py --steps 200 --cores 2 --json results/bench-train-processes.json
    python benchmarks/train_processes.py --recipe recipes/multi30k-en-de.toml \
        --layouts ddp,ddp:output_vocab=target,ddp,ddp:output_vocab=target     # a recipe field, side by side

Layouts (``--cores`` = C):
    threads   1 process × C threads, max_tokens per update as in the recipe
    ddp       C processes × 1 thread, max_tokens / C per process: the same tokens per update
    ddp-big   C processes × 1 thread, the recipe's max_tokens per process: C× the tokens per update

A layout may carry recipe overrides after colons (``ddp:output_vocab=target:model.dropout=0.2``), to
measure a setting against the plain layout in one run; ratios are then against the first layout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_layout(recipe: Path, procs: int, threads: int, max_tokens: int, steps: int, skip: int,
               overrides: tuple[str, ...] = ()) -> dict:  # fmt: skip
    out = Path(tempfile.mkdtemp(prefix="aiayn-bench-")) / "run"
    # a constant schedule: a recipe's cosine would end within its warm-up here (refused); as fast
    args = [str(recipe), f"out_dir={out}", f"threads={threads}", f"max_tokens={max_tokens}",
            f"max_steps={steps}", f"eval_every={steps + 1}", "eval_bleu=false", "eval_iters=1",
            "log_every=10", "progress=false", "max_minutes=0", "horizon=steps", "schedule=constant",
            "device=cpu", *overrides]  # fmt: skip
    if procs == 1:
        cmd = [sys.executable, "-m", "aiayn", "train", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={procs}", "-m", "aiayn", "train", *args]  # fmt: skip
    try:  # threads=… sets each process's torch threads (torchrun's OMP_NUM_THREADS=1 agrees)
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    train = [r for r in lines if r.get("split") == "train" and r["step"] > skip]
    tok_s = statistics.median(r["tokens_per_s"] for r in train)
    # rank 0's batch × ranks; the trainer logs one update per window, so this mean is of a sample
    tokens = statistics.mean(r["tokens"] for r in train) * procs
    # the median window hides the few slow batches (long sentences); the whole span counts them
    seconds = train[-1]["elapsed"] - train[0]["elapsed"]
    span = (train[-1]["step"] - train[0]["step"]) / seconds if seconds > 0 else tok_s / tokens
    return {"processes": procs, "threads": threads, "max_tokens_per_process": max_tokens,
            "tokens_per_s": round(tok_s), "tokens_per_update": round(tokens),
            "updates_per_s": round(tok_s / tokens, 3), "updates_per_s_all_steps": round(span, 3),
            "tokens_per_s_all_steps": round(span * tokens)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "multi30k-de-en.toml"))
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=120, help="updates per layout")
    ap.add_argument("--skip", type=int, default=20, help="warm-up updates left out of the median")
    ap.add_argument("--layouts", default="threads,ddp,ddp-big")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.steps <= args.skip:
        ap.error(
            f"--steps ({args.steps}) must exceed --skip ({args.skip}): the median is of the updates after it"
        )
    from provenance import write_result

    from aiayn.cli.demo import machine
    from aiayn.training.recipe import load_recipe

    max_tokens = load_recipe(args.recipe).max_tokens
    c = args.cores
    layouts = {"threads": (1, c, max_tokens), "ddp": (c, 1, max_tokens // c), "ddp-big": (c, 1, max_tokens)}
    rows = []  # a layout may be listed twice (e.g. threads,ddp,threads) to see the noise
    for spec in args.layouts.split(","):
        name, *overrides = spec.split(":")
        if name not in layouts:
            raise SystemExit(f"--layouts: unknown layout {name!r} (known: {', '.join(layouts)})")
        run = run_layout(Path(args.recipe), *layouts[name], args.steps, args.skip, tuple(overrides))
        rows.append({"layout": spec, **run})
        print(json.dumps(rows[-1]), flush=True)
    first = rows[0]["layout"]
    mean = {spec: statistics.mean(r["tokens_per_s"] for r in rows if r["layout"] == spec) for spec in
            dict.fromkeys(r["layout"] for r in rows)}  # fmt: skip
    for spec, tok_s in mean.items():
        ratio = tok_s / mean[first]
        print(f"{spec:8s} {ratio:.2f}× the mean tokens/s of {first!r}")
    if args.json:
        out = {"recipe": args.recipe, "cores": c, "steps": args.steps, "skip": args.skip,
               "machine": machine(), "rows": rows}  # fmt: skip
        write_result(args.json, out)  # temp file + rename: nothing half-written


if __name__ == "__main__":
    from provenance import run_main

    run_main(main)
