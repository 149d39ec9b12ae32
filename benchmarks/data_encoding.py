"""How long encoding a corpus takes, how much memory it needs, and how little padding batches carry.

Encodes Multi30k train (29k pairs) and a synthetic corpus of 1M pairs (Multi30k words shuffled into
new sentences of Multi30k-like lengths) with a joint 8k BPE vocabulary, each in a fresh child
process so that its peak resident memory (``ru_maxrss``) is its own, into a temporary cache. Prints
one table: check pass (line counts, UTF-8, hash), encoding, reopening from the cache, building one
epoch of batches, the resident memory after imports and tokenizer (``RSS``), the peak above it while
encoding (``+enc``) and over the whole run (``+all``, with the cache reopened and one epoch of
batches built), ``ru_maxrss`` (which includes the torch import), and the share of real (non-pad)
ids in batches at ``--max-tokens`` (default 4096).

Usage: python benchmarks/data_encoding.py [--pairs 1000000] [--max-tokens 4096]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from provenance import run_main


def _rss_mib(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of this process, in MiB."""
    status = Path("/proc/self/status").read_text()
    return int(status.split(f"{field}:")[1].split()[0]) / 1024


def _reset_peak() -> None:
    """Start peak tracking afresh (Linux >= 4.0), so the torch import's peak does not hide ours."""
    Path("/proc/self/clear_refs").write_text("5")


def measure(src: str, tgt: str, tok_dir: str, cache: str, max_tokens: int) -> dict:
    """Run in a child process: check, encode, reopen and batch one corpus."""
    from aiayn.data import TokenBatchSampler, encode_parallel, load_parallel, load_tokenizer, non_pad_fraction

    tok = load_tokenizer(tok_dir)
    base = _rss_mib("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    corpus = load_parallel((src, tgt))
    t1 = time.perf_counter()
    enc = encode_parallel(corpus, tok, tok, cache=cache)
    t2 = time.perf_counter()
    encode_peak = _rss_mib("VmHWM")
    encode_parallel(load_parallel((src, tgt)), tok, tok, cache=cache)  # a second run: cache hit
    t3 = time.perf_counter()
    sampler = TokenBatchSampler(enc.src.lengths, enc.tgt.lengths, max_tokens=max_tokens, seed=0)
    batches = sampler.batches(0)
    t4 = time.perf_counter()
    n_ids = int(enc.src.offsets[-1] + enc.tgt.offsets[-1])
    return dict(
        pairs=len(enc),
        ids=n_ids,
        check_s=t1 - t0,
        encode_s=t2 - t1,
        rerun_s=t3 - t2,
        batch_epoch_s=t4 - t3,
        base_mib=base,
        encode_peak_mib=encode_peak,
        peak_mib=_rss_mib("VmHWM"),
        maxrss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # incl. imports
        cache_mib=sum(f.stat().st_size for f in enc.directory.iterdir()) / 2**20,
        batches=len(batches),
        non_pad=non_pad_fraction(batches, enc.src.lengths, enc.tgt.lengths),
    )


def synthetic(n_pairs: int, folder: Path, seed: int = 0) -> tuple[Path, Path]:
    """``n_pairs`` random sentence pairs from Multi30k's words; pair i takes its two word counts
    from one Multi30k pair, so that its side lengths correlate as a real translation's do."""
    from aiayn.data import load_parallel

    rng = np.random.default_rng(seed)
    pairs = list(load_parallel("multi30k", "train"))
    which = rng.integers(0, len(pairs), n_pairs)
    paths = folder / "synthetic.de", folder / "synthetic.en"
    for side, path in enumerate(paths):
        words = np.array(sorted({w for p in pairs for w in p[side].split()}))
        lengths = np.array([len(p[side].split()) for p in pairs])[which]
        with open(path, "w", encoding="utf-8") as f:
            for start in range(0, n_pairs, 100_000):
                lens = lengths[start : start + 100_000]
                flat = words[rng.integers(0, len(words), int(lens.sum()))]
                cuts = np.cumsum(lens)[:-1]
                f.writelines(" ".join(s) + "\n" for s in np.split(flat, cuts))
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=1_000_000)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, max_tokens=args.max_tokens)))
        return

    from aiayn.cli.demo import machine
    from aiayn.data import SentencePieceTokenizer, data_dir, load_parallel

    print(machine())  # timings are this machine's

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        tok = SentencePieceTokenizer.train(load_parallel("multi30k", "train").sentences(), 8000)
        print(f"joint BPE 8000 trained on Multi30k train in {time.perf_counter() - t0:.2f} s")
        tok.save(tmp / "tok")
        m30k = data_dir() / "multi30k"
        cases = {"Multi30k train": (m30k / "train.de.gz", m30k / "train.en.gz")}
        t0 = time.perf_counter()
        cases[f"synthetic {args.pairs:,}"] = synthetic(args.pairs, tmp)
        print(f"synthetic corpus written in {time.perf_counter() - t0:.1f} s")

        cols = ["pairs", "ids", "check s", "encode s", "rerun s", "epoch s", "RSS MiB", "+enc MiB"]
        cols += ["+all MiB", "maxrss", "cache MiB", "non-pad"]
        print(f"{'corpus':<20}" + "".join(f"{c:>11}" for c in cols))
        for name, (src, tgt) in cases.items():
            cmd = [sys.executable, __file__, "--max-tokens", str(args.max_tokens), "--child"]
            cmd += [str(src), str(tgt), str(tmp / "tok"), str(tmp / "cache")]
            r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            row = [f"{r['pairs']:,}", f"{r['ids']:,}"]
            row += [f"{r[k]:.2f}" for k in ("check_s", "encode_s", "rerun_s", "batch_epoch_s")]
            row += [f"{r['base_mib']:.0f}", f"{r['encode_peak_mib'] - r['base_mib']:.0f}"]
            row += [f"{r['peak_mib'] - r['base_mib']:.0f}", f"{r['maxrss_mib']:.0f}"]
            row += [f"{r['cache_mib']:.1f}", f"{r['non_pad']:.3f}"]
            print(f"{name:<20}" + "".join(f"{c:>11}" for c in row))


if __name__ == "__main__":
    run_main(main)
