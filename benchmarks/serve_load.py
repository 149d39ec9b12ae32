"""Load on ``aiayn serve``: closed-loop clients and open-loop (Poisson) arrivals, per scheduling mode.

Starts the server as its own process for each mode — ``one`` (one request at a time,
``--max-batch-texts 0``), ``batch`` (dynamic batching of whole searches, ``--scheduling batch``),
``step`` (requests join and leave a running search between decoding steps, ``--scheduling step``) —
and sends Multi30k test sources, one sentence per request (``/v1/translate``, beam ``--beam``):

* closed loop: N client threads, each sending its next request when the last is answered;
  sentences/s and p50/p95/p99 latency;
* open loop (``--rates``): requests arrive at exponential intervals (a Poisson process) of the given
  mean rate, whether earlier ones were answered or not, as real traffic does; latency is counted from
  each request's arrival time, so a server that falls behind shows it. p50/p99 against offered load
  per mode, plotted to ``--plot``.

Then the upper bound: the same sentences translated as one file, as ``aiayn translate`` does (model
loading not counted). Bounded in requests and time; loopback only.

With ``--rounds N`` the whole list of modes runs N times, in reverse order every other round, so that
a VM whose speed drifts during the run moves every mode alike; ``goal`` then holds issue 60's two ratios
for each round, each against the same round's one-request-at-a-time server with one client: sentences/s
(goal ≥ 6 with 16 clients) and p99 latency (goal ≤ 1.5), and their medians.

    python benchmarks/serve_load.py --model runs/demo              # closed loop: 1, 4, 16, 64 clients
    python benchmarks/serve_load.py --model runs/demo --clients 1 16 --rates 5 10 20 40 --plot load.png
    python benchmarks/serve_load.py --model runs/demo --clients 1 16 --modes one step --rounds 3
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from provenance import run_main, write_result  # noqa: E402

from aiayn.cli.demo import machine  # noqa: E402
from aiayn.data.corpus import load_parallel  # noqa: E402
from aiayn.decoding.options import SearchConfig  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402
from aiayn.models.quantize import QUANTIZATIONS, quantize  # noqa: E402
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


MODES = {"one": ["--max-batch-texts", "0", "--scheduling", "batch"],  # one request at a time
         "batch": ["--max-batch-texts", "64", "--scheduling", "batch"],
         "step": ["--max-batch-texts", "64", "--scheduling", "step"]}  # fmt: skip


def start(
    model: str, mode: str, threads: int, window_ms: float, workers: int, quantize: str = "none"
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "aiayn", "serve", "--model", model, "--port", str(port), "--threads",
            str(threads), *MODES[mode], "--queue-size", "256", "--batch-window-ms", str(window_ms),
            "--workers", str(workers), "--quantize", quantize]  # fmt: skip
    log = tempfile.TemporaryFile()  # noqa: SIM115 -- the server writes it as long as it runs (a pipe would fill)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(300):
        if proc.poll() is not None:  # it refused its options or models: say why, at once
            log.seek(0)
            raise SystemExit(log.read().decode("utf-8", "replace").strip() or "the server exited")
        try:
            urllib.request.urlopen(url + "health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start within a minute")


def one(url: str, text: str, beam: int) -> tuple[float, str]:
    """One request's latency and outcome: ``ok``, ``refused`` (429: the server's bounded queue said
    no at once) or ``failed`` (any other status, a timeout, a broken connection)."""
    body = json.dumps({"q": text, "beam": beam}).encode()
    req = urllib.request.Request(url + "v1/translate", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            outcome = "ok" if r.status == 200 else "failed"
    except urllib.error.HTTPError as e:
        outcome = "refused" if e.code == 429 else "failed"
    except OSError:  # a timeout or a connection the server dropped
        outcome = "failed"
    return time.perf_counter() - t0, outcome


def summary(results: list[tuple[float, str]], wall: float) -> dict:
    """Sentences translated per second (answered requests) and latency percentiles over every
    request but the refused: a refusal (429 under overload) comes back at once and would flatter
    the tail, while a failure (a timeout, an error) is counted at the time it took, so that a server
    that stops answering shows it in its p99 instead of dropping out of it. ``refused`` and
    ``failed`` count the others (``errors``: both). Percentiles interpolate between measured
    latencies (``inclusive``: never past the largest, as the default ``exclusive`` method is with
    fewer than 100 of them)."""
    latencies = sorted(s for s, outcome in results if outcome != "refused")
    q = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else latencies * 99
    ms = (lambda i: round(1000 * q[i], 1)) if q else (lambda i: None)
    refused = sum(outcome == "refused" for _, outcome in results)
    failed = sum(outcome == "failed" for _, outcome in results)
    return {"sentences_per_s": round((len(results) - refused - failed) / wall, 2), "p50_ms": ms(49),
            "p95_ms": ms(94), "p99_ms": ms(98), "refused": refused, "failed": failed,
            "errors": refused + failed}  # fmt: skip


def load(url: str, texts: list[str], clients: int, beam: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda t: one(url, t, beam), texts))
    return summary(results, time.perf_counter() - t0)


def open_loop(url: str, texts: list[str], rate: float, beam: int, seed: int = 0) -> dict:
    """Requests at Poisson arrivals of mean ``rate`` per second; latency from each arrival time."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in texts:
        t += rng.expovariate(rate)
        arrivals.append(t)
    t0 = time.perf_counter()

    def send(i: int) -> tuple[float, bool]:
        delay = t0 + arrivals[i] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        _, outcome = one(url, texts[i], beam)
        return time.perf_counter() - (t0 + arrivals[i]), outcome

    with ThreadPoolExecutor(len(texts)) as pool:  # a thread per request: nobody waits for a free client
        results = list(pool.map(send, range(len(texts))))
    return {"offered_per_s": rate, **summary(results, time.perf_counter() - t0)}


def against_one(rows: list[dict]) -> dict:
    """Issue 60's ratios, round by round: each closed-loop row with more than one client (a mode
    other than ``one``) against the same round's ``one`` row with one client — its sentences/s
    (``NAME_throughput_vs_one``: goal ≥ 6 at 16 clients) and its p99 (``NAME_p99_vs_one_client``:
    goal ≤ 1.5) — with the median of the rounds. Empty without a ``one`` row at one client."""
    closed = [r for r in rows if "clients" in r]
    base = {r["round"]: r for r in closed if r["mode"] == "one" and r["clients"] == 1}
    ratios: dict[str, list[float]] = {}
    for r in closed:
        b = base.get(r["round"])
        if b is None or r["mode"] == "one" or r["clients"] == 1 or not b["sentences_per_s"]:
            continue
        name = f"{r['mode']}_{r['clients']}_clients"
        speedup = r["sentences_per_s"] / b["sentences_per_s"]
        ratios.setdefault(f"{name}_throughput_vs_one", []).append(round(speedup, 2))
        if r["p99_ms"] is not None and b["p99_ms"]:
            ratios.setdefault(f"{name}_p99_vs_one_client", []).append(round(r["p99_ms"] / b["p99_ms"], 2))
    return {k: {"rounds": v, "median": round(statistics.median(v), 2)} for k, v in ratios.items()}


def _median(values) -> float:
    """The median of the rounds that answered at this rate (None: none did, all refused); NaN if none."""
    answered = [v for v in values if v is not None]
    return statistics.median(answered) if answered else math.nan


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mode in MODES:
        by_rate: dict[float, list[dict]] = {}  # with --rounds: the median of the rounds at each rate
        for r in rows:
            if r["mode"] == mode and "offered_per_s" in r:
                by_rate.setdefault(r["offered_per_s"], []).append(r)
        if not by_rate:
            continue
        x = sorted(by_rate)
        p50, p99 = ([_median(r[key] for r in by_rate[rate]) for rate in x] for key in ("p50_ms", "p99_ms"))
        line = ax.plot(x, p50, "o-", label=f"{mode}: p50")[0]
        ax.plot(x, p99, "s--", color=line.get_color(), label=f"{mode}: p99")
    ax.set(
        xlabel="offered load (sentences/s, Poisson arrivals)",
        ylabel="latency (ms)",
        yscale="log",
    )
    ax.set_title(title, fontsize=10)  # two lines: the machine's name is long
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = Path(path).with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)  # nothing half-written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a translation model directory (de→en on Multi30k)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--window-ms", type=float, default=None, help="the server's --batch-window-ms")
    ap.add_argument("--workers", type=int, default=1, help="the server's --workers (batches at once)")
    ap.add_argument("--quantize", choices=QUANTIZATIONS, default="none", help="the server's --quantize")
    ap.add_argument(
        "--modes",
        nargs="+",
        default=list(MODES),
        choices=list(MODES),
        help="one: one request at a time; batch: whole searches batched; step: iteration-level",
    )
    ap.add_argument(
        "--rates", type=float, nargs="*", default=[], help="open-loop arrival rates (sentences/s)"
    )
    ap.add_argument("--rounds", type=int, default=1, help="runs of the whole list of modes, alternating "
                    "their order, so that a drifting VM moves every mode alike (see above)")  # fmt: skip
    ap.add_argument("--plot", help="with --rates: p50/p99 latency against offered load, as a PNG")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.requests < 2:
        ap.error("--requests must be at least 2 (percentiles need two latencies)")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    texts = [src for src, _ in load_parallel("multi30k", "test", "de", "en")][: args.requests]
    rows = []
    window = Settings().batch_window_ms if args.window_ms is None else args.window_ms
    for round_ in range(1, args.rounds + 1):
        for mode in args.modes if round_ % 2 else args.modes[::-1]:
            proc, url = start(args.model, mode, args.threads, window, args.workers, args.quantize)
            mine = []
            try:
                one(url, texts[0], args.beam)  # warm-up
                for n in args.clients:
                    mine.append({"mode": mode, "clients": n, **load(url, texts, n, args.beam)})
                    print(json.dumps({**mine[-1], "round": round_}), flush=True)
                for rate in args.rates:
                    mine.append({"mode": mode, **open_loop(url, texts, rate, args.beam)})
                    print(json.dumps({**mine[-1], "round": round_}), flush=True)
                peak = rss_mb(proc.pid)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
            rows += [{**row, "server_peak_rss_mb": round(peak, 1), "round": round_} for row in mine]
    # the bound: what `aiayn translate` does with the same sentences as one file (model loaded first,
    # as in the server: start-up is not counted)
    torch.set_num_threads(args.threads)
    translator = Translator.from_dir(args.model)
    quantize(translator.model, args.quantize)
    translator.translate(texts[:8], SearchConfig(beam=args.beam))  # warm-up, as each server had
    t0 = time.perf_counter()
    translator.translate(texts, SearchConfig(beam=args.beam))
    bound = len(texts) / (time.perf_counter() - t0)
    out = {"machine": machine(), "model": args.model, "beam": args.beam, "requests": len(texts),
           "batch_window_ms": window, "workers": args.workers, "threads": args.threads,
           "quantize": args.quantize, "command": "python " + " ".join(sys.argv), "rows": rows,
           "cli_one_file_sentences_per_s": round(bound, 2)}  # fmt: skip
    print(json.dumps({"cli_one_file_sentences_per_s": out["cli_one_file_sentences_per_s"]}))
    out["goal"] = against_one(rows)
    for name, ratios in out["goal"].items():
        print(f"{name}: median {ratios['median']}  (each round: {', '.join(map(str, ratios['rounds']))})")
    if args.plot and args.rates:
        plot(rows, args.plot, f"aiayn serve, beam {args.beam}\n{out['machine']}")
    if args.json:
        write_result(args.json, out)  # temp file + rename: nothing half-written
    return 0


if __name__ == "__main__":
    run_main(main)
