"""Decoding engines on the same weights: aiayn float32, int8 and bfloat16, CTranslate2 float32 and int8, HF.

aiayn float32 also runs with oneDNN kernels on prepacked weights (``aiayn-fp32-onednn``) and with the
kernel chosen per weight shape by a timing at load (``aiayn-fp32-auto``): ``--gemm onednn|auto``; and
bfloat16 (``--quantize bf16``, ``aiayn-bf16``) likewise (``aiayn-bf16-onednn``).

Two models: (a) a trained translation model directory (``--model``, e.g. ``make demo``'s
runs/demo) over the 1,000 Multi30k test2016 sources, scored with sacreBLEU; (b) a random model of
OPUS-MT's sizes (d_model 512, 6+6 layers, d_ff 2048, 8 heads; the vocabulary of (a)'s tokenizer,
since CTranslate2 needs the pieces) decoding every sentence to a fixed length, so that every engine
does the same work whatever the random weights predict. Settings: batch 32 beam 4 (CTranslate2's own
benchmark), batch 64 greedy, batch 1 beam 4 (latency, on the first ``--latency-sentences`` in the
length order below: the shortest sources, which (b)'s fixed-length outputs make matter little).

Every engine runs in a process of its own (its peak RSS is its memory, the Python runtime and its own
libraries included: a CTranslate2 worker imports neither torch nor aiayn's model, and reads its
vocabularies from the export; before 2026-12-04 it loaded both, torch and the float32 model, which
counted in its RSS and whose OpenMP threads slowed it) on the same batches: the sources sorted by
length, cut into fixed-size batches.
Outputs are compared with aiayn float32:
CTranslate2 float32 should give the same tokens (the length penalty is off, as in the export tests),
int8 engines the same BLEU within a few tenths. Reports target tokens/s (eos excluded), latency per
sentence at batch 1, peak RSS, and the ratios against aiayn float32 (speed-ups > 1 mean faster).

    python benchmarks/decoding_engines.py --model runs/demo --json results/decoding-engines.json
    python benchmarks/decoding_engines.py --model runs/demo --threads 1 --sentences 200 --skip-base
    python benchmarks/decoding_engines.py --model runs/demo --threads 2 --rounds 3  # drift-robust ratios
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENGINES = ("aiayn-fp32", "aiayn-int8", "aiayn-bf16", "aiayn-fp32-onednn", "aiayn-fp32-auto",
           "aiayn-bf16-onednn", "ct2-fp32", "ct2-int8", "hf")  # fmt: skip
SETTINGS = {"b32-beam4": (32, 4), "b64-greedy": (64, 1), "b1-beam4": (1, 4)}
BASE = dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6, dropout=0.0)
MAX_LEN = 100  # output limit of the trained model: above any Multi30k test translation
# ``--isa``: each library's documented switch to the same ceiling, for every engine's worker: PyTorch's
# own kernels, oneDNN (PyTorch's and CTranslate2's), MKL, fbgemm (int8), CTranslate2's own kernels
ISA_CEILINGS = {
    "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2", "CT2_FORCE_CPU_ISA": "AVX2"},
}  # fmt: skip


def machine() -> str:
    from aiayn.cli.demo import machine as describe

    return describe()


# ---------------------------------------------------------------------------------------------- worker
def load_engine(name: str, model_dir: Path, ct2_dir: Path, hf_dir: Path, threads: int):
    """``decode(batch of source ids (eos excluded), beam, fixed_len or None) -> target ids`` of an engine."""
    if name.startswith("ct2"):
        return _ct2_engine(name, ct2_dir, threads)
    import torch  # not in a CTranslate2 worker: its peak RSS is CTranslate2's

    torch.set_num_threads(threads)
    if name.startswith("aiayn"):
        from aiayn.decoding.options import SearchConfig
        from aiayn.decoding.translator import Translator
        from aiayn.models.prepack import prepack
        from aiayn.models.quantize import quantize

        t = Translator.from_dir(model_dir)
        _, precision, *gemm = name.split("-")  # aiayn-PRECISION[-GEMM]
        quantize(t.model, "none" if precision == "fp32" else precision)
        prepack(t.model, gemm[0] if gemm else "blas")
        eos = t.model.config.eos_id

        def decode(batch, beam, fixed):
            n = fixed or MAX_LEN
            cfg = SearchConfig(beam=beam, lenpen=0.0, max_len=n, min_len=fixed or 0)
            hyps = t.search(batch, cfg, max_tokens=10**9)  # one batch: the benchmark's own
            return [[i for i in h[0].tokens if i != eos] for h in hyps]

        return decode
    from transformers import MarianMTModel

    hf = MarianMTModel.from_pretrained(hf_dir).eval()
    pad, eos = hf.config.pad_token_id, hf.config.eos_token_id

    def decode(batch, beam, fixed):
        rows = [torch.tensor([*s, eos]) for s in batch]
        src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad)
        n = fixed or MAX_LEN
        with torch.inference_mode():
            out = hf.generate(
                input_ids=src,
                attention_mask=src != pad,
                num_beams=beam,
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=fixed or 0,
                length_penalty=0.0,
                early_stopping=True,
            )
        return [[i for i in row[1:] if i not in (pad, eos)] for row in out.tolist()]

    return decode


def _ct2_engine(name: str, ct2_dir: Path, threads: int):
    """CTranslate2's ``decode``: ids to pieces and back through the vocabularies of its export (its
    ids are aiayn's), so that the worker needs no tokenizer library of aiayn's, nor torch."""
    import ctranslate2

    shared = ct2_dir / "shared_vocabulary.json"
    files = (shared, shared) if shared.is_file() else (ct2_dir / "source_vocabulary.json",
                                                       ct2_dir / "target_vocabulary.json")  # fmt: skip
    src_pieces, tgt_pieces = (json.loads(f.read_text(encoding="utf-8")) for f in files)
    tgt_ids = {p: i for i, p in enumerate(tgt_pieces)}
    compute = "int8" if name.endswith("int8") else "float32"
    tr = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute, intra_threads=threads)

    def decode(batch, beam, fixed):
        out = tr.translate_batch(
            [[src_pieces[i] for i in s] for s in batch],
            beam_size=beam,
            length_penalty=0.0,
            max_batch_size=len(batch),
            max_decoding_length=fixed or MAX_LEN,
            min_decoding_length=fixed or 0,
        )
        return [[tgt_ids[p] for p in r.hypotheses[0]] for r in out]

    return decode


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: unlike ru_maxrss, not inherited from the parent)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def worker(args) -> None:
    job = json.loads(Path(args.worker).read_text())
    decode = load_engine(job["engine"], Path(job["model"]), Path(job["ct2"]), Path(job["hf"]), job["threads"])
    report = {"engine": job["engine"], "threads": job["threads"], "runs": {}}
    for setting, (size, beam) in SETTINGS.items():
        sources = job["latency_sources"] if size == 1 else job["sources"]
        batches = [sources[i : i + size] for i in range(0, len(sources), size)]
        decode(batches[0], beam, job["fixed"])  # warm-up
        best, outputs = float("inf"), None
        for _ in range(job["repeats"]):
            t0 = time.perf_counter()
            outputs = [o for b in batches for o in decode(b, beam, job["fixed"])]
            best = min(best, time.perf_counter() - t0)
        tokens = sum(len(o) for o in outputs)
        report["runs"][setting] = {
            "seconds": round(best, 3),
            "sentences": len(sources),
            "tokens": tokens,
            "tokens_per_s": round(tokens / best, 1),
            "ms_per_sentence": round(1000 * best / len(sources), 2),
            "outputs": outputs,
        }
    report["peak_rss_mb"] = peak_rss_mb()
    Path(job["out"]).write_text(json.dumps(report))


# ---------------------------------------------------------------------------------------------- parent
def prepare(model_dir: Path, work: Path, base: bool) -> tuple[Path, Path, Path]:
    """The model directory to decode with (the trained one, or a random base-size one with the
    trained one's tokenizers), and its CTranslate2 and HF Marian exports."""
    import torch

    from aiayn import Transformer, TransformerConfig
    from aiayn.data.tokenizer import save_translation_tokenizers
    from aiayn.interop.ctranslate2 import export_ctranslate2
    from aiayn.interop.marian import export_marian
    from aiayn.interop.model_dir import load_translation_dir
    from aiayn.models.io import save_model

    model, src_tok, tgt_tok = load_translation_dir(model_dir)
    name = "trained"
    if base:
        torch.manual_seed(0)
        c, name = model.config, "base"
        model = Transformer(
            TransformerConfig(
                src_vocab_size=c.src_vocab_size,
                tgt_vocab_size=c.tgt_vocab_size,
                share_embeddings=c.share_embeddings,
                **BASE,
            )
        ).eval()
        model_dir = work / name
        save_model(model, model_dir)
        save_translation_tokenizers(model_dir, src_tok, tgt_tok)
    export_ctranslate2(model, src_tok, tgt_tok, work / f"ct2-{name}")
    export_marian(model, work / f"hf-{name}")
    return model_dir, work / f"ct2-{name}", work / f"hf-{name}"


def ct2_env(spec: str) -> tuple[str, dict[str, str]]:
    """One ``--ct2-env NAME=VAR=VALUE[,VAR=VALUE]`` as ``(NAME, {VAR: VALUE})``, checked when the
    command line is read (not after the exports)."""
    name, _, assignments = spec.partition("=")
    pairs = [a.partition("=") for a in assignments.split(",")]
    if not name or any(not var or not eq for var, eq, _ in pairs):
        raise argparse.ArgumentTypeError(f"{spec!r} is not NAME=VAR=VALUE[,VAR=VALUE] (dnnl=CT2_USE_MKL=0)")
    return name, {var: value for var, _, value in pairs}


def variants(engine: str, ct2_envs: list[tuple[str, dict[str, str]]]) -> list[tuple[str, dict[str, str]]]:
    """``(label, environment)`` runs of an engine: CTranslate2 once as it is and once per
    ``--ct2-env`` (its documented switches, e.g. CT2_USE_MKL=0)."""
    runs = [(engine, {})]
    if engine.startswith("ct2"):
        runs += [(f"{engine}[{name}]", env) for name, env in ct2_envs]
    return runs


def run_worker(job_file: Path, env: dict[str, str]) -> list[str]:
    """Run one engine's worker; CTranslate2's own log lines (CT2_VERBOSE=1: the CPU, the ISA and the
    GEMM backend it chose) are returned."""
    done = subprocess.run([sys.executable, __file__, "--worker", str(job_file)], text=True,
                          stderr=subprocess.PIPE, env={**os.environ, "CT2_VERBOSE": "1", **env})  # fmt: skip
    if done.returncode:  # its traceback, not only the exit status
        sys.stderr.write(done.stderr)
        raise subprocess.CalledProcessError(done.returncode, done.args)
    log = [line.split("] ", 3)[-1] for line in done.stderr.splitlines() if "[ctranslate2]" in line]
    sys.stderr.write("".join(f"{line}\n" for line in done.stderr.splitlines() if "[ctranslate2]" not in line))
    return log


def run_engines(args, model_dir, ct2_dir, hf_dir, sources, latency, fixed, work: Path) -> list[dict]:
    """Every engine's report. With ``--rounds N`` the whole list of engines runs N times, every
    other round in reverse order, and each engine keeps its fastest round per setting (every
    round's seconds listed), so a VM whose speed drifts during the run slows every engine alike."""
    runs = [(threads, engine, label, env) for threads in args.threads for engine in args.engines
            for label, env in variants(engine, args.ct2_env)]  # fmt: skip
    reports: dict[tuple[str, int], dict] = {}
    for round_ in range(args.rounds):
        for threads, engine, label, env in runs if round_ % 2 == 0 else runs[::-1]:
            job = {
                "engine": engine,
                "threads": threads,
                "model": str(model_dir),
                "ct2": str(ct2_dir),
                "hf": str(hf_dir),
                "sources": sources,
                "latency_sources": sources[:latency],
                "fixed": fixed,
                "repeats": args.repeats,
                "out": str(work / "report.json"),
            }
            (work / "job.json").write_text(json.dumps(job))
            log = run_worker(work / "job.json", env)
            r = {**json.loads((work / "report.json").read_text()), "engine": label}
            if log:
                r["ct2_log"], r["env"] = log, env
            print(
                f"  {label:10} {threads} thr  "
                + "  ".join(f"{k} {v['tokens_per_s']:8.1f} tok/s" for k, v in r["runs"].items())
                + f"  rss {r['peak_rss_mb']:.0f} MB"
                + (f"  (round {round_ + 1})" if args.rounds > 1 else ""),
                flush=True,
            )
            reports[label, threads] = merge_rounds(reports.get((label, threads)), r)
    return [reports[label, threads] for threads, _, label, _ in runs]


def merge_rounds(kept: dict | None, new: dict) -> dict:
    """One engine's report over rounds: per setting the fastest round, every round's seconds."""
    if kept is None:
        for run in new["runs"].values():
            run["round_seconds"] = [run["seconds"]]
        return new
    for setting, run in new["runs"].items():
        seconds = kept["runs"][setting]["round_seconds"] + [run["seconds"]]
        if run["seconds"] < kept["runs"][setting]["seconds"]:
            kept["runs"][setting] = run
        kept["runs"][setting]["round_seconds"] = seconds
    kept["peak_rss_mb"] = max(kept["peak_rss_mb"], new["peak_rss_mb"])
    return kept


def summarise(reports: list[dict], detok, refs) -> list[dict]:
    """Per engine and thread count: speeds, ratios to aiayn float32, agreement and BLEU."""
    import sacrebleu

    rows = []
    for r in reports:
        ref = next(x for x in reports if x["engine"] == "aiayn-fp32" and x["threads"] == r["threads"])
        row = {"engine": r["engine"], "threads": r["threads"], "peak_rss_mb": r["peak_rss_mb"]}
        row |= {k: r[k] for k in ("env", "ct2_log") if k in r}
        for setting, run in r["runs"].items():
            base = ref["runs"][setting]
            same = sum(a == b for a, b in zip(run["outputs"], base["outputs"])) / len(base["outputs"])
            entry = {
                k: run[k] for k in ("tokens_per_s", "ms_per_sentence", "tokens", "sentences", "round_seconds")
            }
            entry |= {
                "speed_vs_aiayn_fp32": round(run["tokens_per_s"] / base["tokens_per_s"], 3),
                "same_output_as_aiayn_fp32": round(same, 4),
            }
            if refs is not None and run["sentences"] == len(refs):
                hyps = [detok(o) for o in run["outputs"]]
                entry["bleu"] = round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
            row[setting] = entry
        rows.append(row)
    return rows


def table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'engine':18} {'thr':>3} " + " ".join(f"{s:>24}" for s in SETTINGS) + "   RSS MB")
    for row in rows:
        cells = []
        for s in SETTINGS:
            e = row[s]
            extra = f" B{e['bleu']:.2f}" if "bleu" in e else f" ={e['same_output_as_aiayn_fp32']:.2f}"
            cells.append(f"{e['tokens_per_s']:7.0f} ({e['speed_vs_aiayn_fp32']:.2f}x){extra}")
        print(
            f"{row['engine']:18} {row['threads']:3d} "
            + " ".join(f"{c:>24}" for c in cells)
            + f" {row['peak_rss_mb']:8.0f}"
        )


def verdict(result: dict, tolerance: float = 0.3) -> dict:
    """The goal's comparison, per model, thread count and setting: aiayn's fastest engine against
    CTranslate2's fastest (its ``--ct2-env`` variants included), each among the engines whose BLEU on
    the trained model is within ``tolerance`` of aiayn float32's in that setting (batch 1 has no
    BLEU of its own: batch 32's, the same beam, stands for it; the base model, the trained one's).
    At batch 1 the lower ms per sentence wins, elsewhere the higher target tokens/s;
    ``aiayn_vs_ct2`` > 1 means aiayn is faster."""
    trained = result["trained"]

    def bleu(engine: str, threads: int, setting: str) -> float | None:
        row = next((r for r in trained if r["engine"] == engine and r["threads"] == threads), None)
        entry = None if row is None else row[setting] if "bleu" in row[setting] else row["b32-beam4"]
        return None if entry is None else entry.get("bleu")

    out: dict[str, list[dict]] = {}
    for part in ("trained", "base"):
        for threads in sorted({r["threads"] for r in result.get(part, [])}):
            rows = [r for r in result[part] if r["threads"] == threads]
            for setting in SETTINGS:
                floor = bleu("aiayn-fp32", threads, setting)
                if floor is None:
                    continue
                fit = [r for r in rows if (b := bleu(r["engine"], threads, setting)) is not None
                       and b >= floor - tolerance]  # fmt: skip
                best = {side: max((r for r in fit if r["engine"].startswith(side)),
                                  key=lambda r, s=setting: _speed(r, s), default=None)
                        for side in ("aiayn", "ct2")}  # fmt: skip
                if None in best.values():
                    continue
                a, c = _speed(best["aiayn"], setting), _speed(best["ct2"], setting)
                ratio = c / a if setting == "b1-beam4" else a / c  # > 1: aiayn faster
                out.setdefault(part, []).append({
                    "threads": threads, "setting": setting, "aiayn": best["aiayn"]["engine"],
                    "ct2": best["ct2"]["engine"], "aiayn_vs_ct2": round(ratio, 3), "met": ratio >= 1.0,
                } | _round_ratios(best["aiayn"][setting], best["ct2"][setting], setting))  # fmt: skip
    return out


def _round_ratios(a: dict, c: dict, setting: str) -> dict:
    """With ``--rounds``: the same two engines' ratio in each round (the same sweep of the engines),
    beside the ratio of their fastest rounds, to show how far the VM's drift moves it."""
    if len(a.get("round_seconds", [])) < 2 or len(c.get("round_seconds", [])) < 2:
        return {}
    pairs = zip(a["round_seconds"], c["round_seconds"])
    if setting == "b1-beam4":  # the same sentences: seconds per sentence, lower wins
        return {"aiayn_vs_ct2_rounds": [round(sc / sa, 3) for sa, sc in pairs]}
    return {"aiayn_vs_ct2_rounds": [round(a["tokens"] / sa / (c["tokens"] / sc), 3) for sa, sc in pairs]}


def _speed(row: dict, setting: str) -> float:
    """Higher is faster: target tokens/s, or at batch 1 minus the ms per sentence."""
    return -row[setting]["ms_per_sentence"] if setting == "b1-beam4" else row[setting]["tokens_per_s"]


def print_verdict(goal: dict) -> None:
    print("\naiayn's fastest vs CTranslate2's fastest at equal quality (> 1: aiayn faster)")
    for part, rows in goal.items():
        for v in rows:
            rounds = ", ".join(f"{r:.2f}" for r in v.get("aiayn_vs_ct2_rounds", []))
            print(f"  ({part}) {v['threads']} thr {v['setting']:10} {v['aiayn']:12} vs {v['ct2']:18} "
                  f"{v['aiayn_vs_ct2']:.2f}x  {'met' if v['met'] else 'NOT met'}"
                  + (f"  (each round: {rounds})" if rounds else ""))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a trained translation model directory (e.g. runs/demo)")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--sentences", type=int, default=1000, help="test2016 sources for the trained model")
    p.add_argument("--base-sentences", type=int, default=128, help="sources for the random base model")
    p.add_argument("--base-len", type=int, default=30, help="the base model's fixed output length")
    p.add_argument("--latency-sentences", type=int, default=100, help="sentences for batch 1 (the shortest)")
    p.add_argument("--base-latency-sentences", type=int, default=16, help="batch-1 sentences, base model")
    p.add_argument(
        "--repeats", type=int, default=2, help="passes per setting in one worker; the fastest is kept"
    )
    p.add_argument("--rounds", type=int, default=1, help="runs of the whole list of engines, alternating its "
                   "order; each engine's fastest round is reported")  # fmt: skip
    p.add_argument("--skip-base", action="store_true")
    p.add_argument(
        "--ct2-env",
        nargs="*",
        type=ct2_env,
        default=[],
        metavar="NAME=VAR=VALUE[,VAR=VALUE]",
        help="also run CTranslate2 with these environment switches, e.g. dnnl=CT2_USE_MKL=0",
    )
    p.add_argument("--isa", choices=ISA_CEILINGS, help="run every engine at most with these instructions "
                   "(an AVX2-only CPU's kernels on this one; not its cores, caches or clock)")  # fmt: skip
    p.add_argument("--json", help="write the figures here")
    p.add_argument(
        "--verdict", metavar="JSON", help="print the goal's comparison of an earlier --json; run nothing"
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    counts = ("sentences", "base_sentences", "base_len", "latency_sentences", "base_latency_sentences",
              "repeats", "rounds")  # fmt: skip
    if small := [f"--{c.replace('_', '-')} {getattr(args, c)}" for c in counts if getattr(args, c) < 1]:
        p.error(f"{', '.join(small)}: must be at least 1")
    if min(args.threads) < 1:
        p.error(f"--threads {' '.join(map(str, args.threads))}: each must be at least 1")
    if not args.worker and not args.verdict and "aiayn-fp32" not in args.engines:
        p.error(
            "--engines must include aiayn-fp32: the other engines' speeds, agreement and BLEU are given "
            "against it"
        )
    if args.worker:
        return worker(args)
    if args.verdict:
        try:
            earlier = json.loads(Path(args.verdict).read_text())
        except (OSError, ValueError) as e:
            p.error(f"--verdict {args.verdict}: {e}")
        return print_verdict(verdict(earlier))
    if not args.model:
        p.error("--model DIR is required")

    from aiayn.data.corpus import load_parallel
    from aiayn.interop.model_dir import load_translation_dir

    if args.isa:
        os.environ.update(ISA_CEILINGS[args.isa])  # the workers inherit it
    print(f"{machine()}; threads {args.threads}; instructions {args.isa or 'all'}", flush=True)
    _, src_tok, tgt_tok = load_translation_dir(args.model)
    test = load_parallel("multi30k", "test", "de", "en")
    srcs, refs = (list(side)[: args.sentences] for side in zip(*test))
    encoded = [src_tok.encode(s) for s in srcs]
    order = sorted(range(len(srcs)), key=lambda i: len(encoded[i]))  # stable: the same order as before
    ids, refs_sorted = [encoded[i] for i in order], [refs[i] for i in order]
    import ctranslate2
    import torch
    import transformers

    result = {"machine": machine(), "torch": torch.__version__, "ctranslate2": ctranslate2.__version__,
              "transformers": transformers.__version__, "settings": SETTINGS, "max_len": MAX_LEN,
              "command": " ".join(sys.argv), "isa_ceiling": ISA_CEILINGS.get(args.isa)}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"(a) trained model {args.model}: {len(ids)} test2016 sources", flush=True)
        dirs = prepare(Path(args.model), work, base=False)
        reports = run_engines(args, *dirs, ids, args.latency_sentences, None, work)
        result["trained"] = summarise(reports, tgt_tok.decode, refs_sorted)
        table("(a) trained model: target tokens/s (× aiayn fp32), BLEU", result["trained"])
        if not args.skip_base:
            print(f"\n(b) random base-size model: {args.base_sentences} sources, {args.base_len} tokens each")
            dirs = prepare(Path(args.model), work, base=True)
            reports = run_engines(
                args,
                *dirs,
                ids[:: max(len(ids) // args.base_sentences, 1)][: args.base_sentences],
                args.base_latency_sentences,
                args.base_len,
                work,
            )
            result["base"] = summarise(reports, None, None)
            table(
                "(b) random base-size model: target tokens/s (× aiayn fp32), share of identical outputs",
                result["base"],
            )
    result["goal"] = verdict(result)
    print_verdict(result["goal"])
    if args.json:
        for part in ("trained", "base"):
            for row in result.get(part, []):
                for s in SETTINGS:
                    row[s].pop("outputs", None)
        from provenance import write_result

        write_result(args.json, result)  # temp file + rename: nothing half-written


if __name__ == "__main__":
    from provenance import run_main

    run_main(main)
