"""Load on ``aiayn serve``: N concurrent clients on 127.0.0.1, dynamic batching on and off.

Starts the server as its own process for each setting, sends the first ``--requests`` Multi30k test
sources (one sentence per request, ``/v1/translate``, beam ``--beam``) from N client threads, and
reports sentences/s, p50/p95/p99 latency, errors and the server's peak RSS; then the upper bound:
the same sentences translated as one file, as ``aiayn translate`` does (model loading not counted).
Bounded in requests and time; loopback only.

    python benchmarks/serve_load.py --model runs/multi30k-de-en                  # 1, 4, 16, 64 clients
    python benchmarks/serve_load.py --model runs/multi30k-de-en --clients 16 --requests 200
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from aiayn.atomic import write_json  # noqa: E402
from aiayn.cli.demo import machine  # noqa: E402
from aiayn.data.corpus import load_parallel  # noqa: E402
from aiayn.decoding.options import SearchConfig  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402
from aiayn.serve.settings import Settings  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):  # the peak resident set
            return int(line.split()[1]) / 1024
    return float("nan")


def start(
    model: str, batching: bool, threads: int, window_ms: float, workers: int
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "aiayn", "serve", "--model", model, "--port", str(port), "--threads",
            str(threads), "--max-batch-texts", "64" if batching else "0", "--queue-size", "256",
            "--batch-window-ms", str(window_ms), "--workers", str(workers)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def one(url: str, text: str, beam: int) -> tuple[float, bool]:
    body = json.dumps({"q": text, "beam": beam}).encode()
    req = urllib.request.Request(url + "v1/translate", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            ok = r.status == 200
    except OSError:
        ok = False
    return time.perf_counter() - t0, ok


def load(url: str, texts: list[str], clients: int, beam: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda t: one(url, t, beam), texts))
    wall = time.perf_counter() - t0
    latencies = sorted(s for s, _ in results)
    q = statistics.quantiles(latencies, n=100)
    return {"sentences_per_s": round(len(texts) / wall, 2), "p50_ms": round(1000 * q[49], 1),
            "p95_ms": round(1000 * q[94], 1), "p99_ms": round(1000 * q[98], 1),
            "errors": sum(not ok for _, ok in results)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a translation model directory (de→en on Multi30k)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--window-ms", type=float, default=None, help="the server's --batch-window-ms")
    ap.add_argument("--workers", type=int, default=1, help="the server's --workers (batches at once)")
    ap.add_argument("--batching", nargs="+", default=["off", "on"], choices=["off", "on"])
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    texts = [src for src, _ in load_parallel("multi30k", "test", "de", "en")][: args.requests]
    rows = []
    window = Settings().batch_window_ms if args.window_ms is None else args.window_ms
    for batching in (mode == "on" for mode in args.batching):
        proc, url = start(args.model, batching, args.threads, window, args.workers)
        try:
            one(url, texts[0], args.beam)  # warm-up
            for n in args.clients:
                row = {"batching": batching, "clients": n, **load(url, texts, n, args.beam)}
                rows.append(row)
                print(json.dumps(row), flush=True)
            peak = rss_mb(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        for row in rows:
            row.setdefault("server_peak_rss_mb", round(peak, 1))
    # the bound: what `aiayn translate` does with the same sentences as one file (model loaded first,
    # as in the server: start-up is not counted)
    torch.set_num_threads(args.threads)
    translator = Translator.from_dir(args.model)
    t0 = time.perf_counter()
    translator.translate(texts, SearchConfig(beam=args.beam))
    bound = len(texts) / (time.perf_counter() - t0)
    out = {"machine": machine(), "beam": args.beam, "requests": len(texts), "batch_window_ms": window,
           "workers": args.workers, "threads": args.threads,
           "rows": rows, "cli_one_file_sentences_per_s": round(bound, 2)}  # fmt: skip
    print(json.dumps({"cli_one_file_sentences_per_s": out["cli_one_file_sentences_per_s"]}))
    if args.json:
        write_json(args.json, out)  # temp file + rename: nothing half-written
    return 0


if __name__ == "__main__":
    sys.exit(main())
