"""Where a translation's decoding time goes, by operation (torch profiler, CPU).

Translates Multi30k test2016 sources with ``Translator.search`` (``--batch`` sentences at a time,
``--beam``) under ``torch.profiler`` and reports each operation's self time as a share of the wall
clock, grouped into what the decoding does: the Linear layers (``addmm``), other matrix products
(the output projection's ``mm``, attention's ``bmm``/``matmul``), the cache's reorders and row
selections (``index_select``, ``index``), softmax and log-softmax, layer norm, concatenation and
copies, the rest; and the wall clock left outside any operation (Python: the search's bookkeeping
and the per-call overhead of a few hundred small operations a step). ``--base`` decodes with a
random model of OPUS-MT's sizes instead (the trained model's vocabulary) to a fixed length, as
``decoding_engines.py`` does, so that the products weigh as much as they do at that size.

    python benchmarks/decoding_profile.py --model runs/demo --batch 1 --beam 4
    python benchmarks/decoding_profile.py --model runs/demo --base --batch 32 --json results/profile.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from decoding_engines import BASE  # noqa: E402  (the sibling benchmark's OPUS-MT sizes)
from provenance import run_main, write_result  # noqa: E402

from aiayn.cli.demo import machine  # noqa: E402
from aiayn.data.corpus import load_parallel  # noqa: E402
from aiayn.decoding.options import SearchConfig  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402
from aiayn.models.prepack import GEMMS, prepack  # noqa: E402
from aiayn.models.quantize import QUANTIZATIONS, quantize  # noqa: E402

GROUPS = {  # operation -> what it is in a decoding step
    "aten::addmm": "Linear layers (addmm)",
    "mkldnn::_linear_pointwise": "Linear layers (addmm)",
    "aten::mm": "other products (output projection mm, attention)",
    "aten::bmm": "other products (output projection mm, attention)",
    "aten::baddbmm": "other products (output projection mm, attention)",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "other products (output projection mm, attention)",
    "aten::index_select": "cache reorders and row selections",
    "aten::index": "cache reorders and row selections",
    "aten::gather": "cache reorders and row selections",
    "aten::_softmax": "softmax, log-softmax",
    "aten::_log_softmax": "softmax, log-softmax",
    "aten::native_layer_norm": "layer norm",
    "aten::cat": "concatenation and copies",
    "aten::copy_": "concatenation and copies",
}


def base_translator(trained: Translator) -> Translator:
    """A random model of OPUS-MT's sizes with the trained model's tokenizers."""
    from aiayn import TransformerConfig, build_transformer

    c = trained.model.config
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=c.src_vocab_size, tgt_vocab_size=c.tgt_vocab_size, **BASE)
    return Translator(build_transformer(cfg).eval(), trained.src_tokenizer, trained.tgt_tokenizer)


def profile(translator: Translator, sources: list[list[int]], config: SearchConfig, batch: int) -> dict:
    """Operation self times while ``sources`` are translated ``batch`` at a time, and the wall clock."""

    def translate_all() -> float:
        t0 = time.perf_counter()
        for start in range(0, len(sources), batch):
            translator.search(sources[start : start + batch], config, max_tokens=10**9)
        return time.perf_counter() - t0

    translator.search(sources[:batch], config, max_tokens=10**9)  # warm-up: first-call costs left out
    plain = translate_all()  # the profiler's own cost per operation inflates the profiled wall clock
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        wall = translate_all()
    ops = {e.key: (e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()}
    return {"wall_s": round(wall, 3), "unprofiled_wall_s": round(plain, 3), "ops": ops}


def summarise(result: dict, top: int) -> dict:
    """Shares of the wall clock: by group, the ``top`` operations, and the time outside any."""
    wall, ops = result["wall_s"], result["ops"]
    groups: dict[str, float] = {}
    for name, (seconds, _) in ops.items():
        group = GROUPS.get(name, "other operations")
        groups[group] = groups.get(group, 0.0) + seconds
    groups["outside any operation (Python)"] = max(wall - sum(s for s, _ in ops.values()), 0.0)
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "wall_s": wall,
        "unprofiled_wall_s": result["unprofiled_wall_s"],
        "groups": {g: round(100 * s / wall, 1) for g, s in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_ops": [{"op": n, "share": round(100 * s / wall, 1), "calls": c} for n, (s, c) in ranked],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a trained translation model directory")
    ap.add_argument("--base", action="store_true", help="a random model of OPUS-MT's sizes, fixed length")
    ap.add_argument("--base-len", type=int, default=30, help="the base model's output length")
    ap.add_argument("--batch", type=int, default=1, help="sentences per search")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--sentences", type=int, default=32, help="test2016 sources to translate")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=12, help="operations listed")
    ap.add_argument("--gemm", choices=GEMMS, default="blas", help="Linear kernels (aiayn.models.prepack)")
    ap.add_argument("--quantize", choices=QUANTIZATIONS, default="none", help="aiayn.models.quantize")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    translator = Translator.from_dir(args.model)
    config = SearchConfig(beam=args.beam, lenpen=0.0)
    if args.base:
        translator = base_translator(translator)
        config = dataclasses.replace(config, min_len=args.base_len, max_len=args.base_len)
    quantize(translator.model, args.quantize)
    prepack(translator.model, args.gemm)
    test = load_parallel("multi30k", "test", "de", "en")
    sources = translator.encode([src for src, _ in list(test)[: args.sentences]])[0]
    with torch.inference_mode():
        out = summarise(profile(translator, sources, config, args.batch), args.top)
    what = "base size" if args.base else args.model
    print(f"{machine()}; {args.threads} threads; {what}; batch {args.batch}, beam {args.beam}, "
          f"{len(sources)} sentences: {out['unprofiled_wall_s']:.2f} s ({out['wall_s']:.2f} s profiled; "
          "shares are of the profiled time)")  # fmt: skip
    for group, share in out["groups"].items():
        print(f"  {share:5.1f}%  {group}")
    for op in out["top_ops"]:
        print(f"         {op['share']:5.1f}%  {op['op']} ({op['calls']:,} calls)")
    if args.json:
        write_result(args.json, {"machine": machine(), "torch": torch.__version__, "model": args.model,
                               "base": args.base, "gemm": args.gemm, "quantize": args.quantize,
                               "batch": args.batch, "beam": args.beam,
                               "sentences": len(sources), "threads": args.threads, **out,
                               "command": " ".join(sys.argv)})  # fmt: skip


if __name__ == "__main__":
    run_main(main)
