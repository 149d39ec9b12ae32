"""Decoding speed: aiayn's KV-cached greedy and beam search against HF transformers' MarianMTModel.

Both models are randomly initialised with the same sizes (no download) and decode the same random
source sentences, batch by batch, to a *fixed* output length (eos forbidden until then: our
``min_len = max_len``, HF's ``min_new_tokens = max_new_tokens``), so both do the same work whatever
the random weights predict. Reports sentences/s, the ratio, and our cached vs uncached speed-up.

    python benchmarks/decoding_vs_hf.py                       # tiny and base, 256 sentences
    python benchmarks/decoding_vs_hf.py --sizes base --sentences 64 --threads 2 --json FILE.json
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch
from provenance import run_main, write_result

from aiayn import Transformer, TransformerConfig
from aiayn.cli.demo import machine
from aiayn.decoding import SearchConfig, Seq2SeqAdapter, search

SIZES = {  # d_model, layers (each side), d_ff, heads, vocab
    "tiny": (128, 4, 256, 4, 10_000),
    "base": (512, 6, 2048, 8, 37_000),
}
PAD, BOS, EOS = 0, 1, 2


def build_models(size: str) -> tuple[Transformer, torch.nn.Module]:
    from transformers import MarianConfig, MarianMTModel

    d, n, ff, h, vocab = SIZES[size]
    sides = dict(n_encoder_layers=n, n_decoder_layers=n, src_vocab_size=vocab, tgt_vocab_size=vocab)
    ours = Transformer(TransformerConfig(d_model=d, n_heads=h, d_ff=ff, dropout=0.0, **sides)).eval()
    hf_config = MarianConfig(
        vocab_size=vocab,
        d_model=d,
        encoder_layers=n,
        decoder_layers=n,
        encoder_attention_heads=h,
        decoder_attention_heads=h,
        encoder_ffn_dim=ff,
        decoder_ffn_dim=ff,
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        bos_token_id=BOS,
        forced_eos_token_id=None,
        dropout=0.0,
        attention_dropout=0.0,
    )
    return ours, MarianMTModel(hf_config).eval()


def random_sources(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g)
    return [
        torch.cat([torch.randint(4, vocab, (int(k) - 1,), generator=g), torch.tensor([EOS])]) for k in lengths
    ]


def batches(sources: list[torch.Tensor], batch_size: int):
    """Padded (src, mask) batches in length order, as a translation tool would form them."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    for i in range(0, len(order), batch_size):
        rows = [sources[j] for j in order[i : i + batch_size]]
        src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD)
        yield src, (src != PAD).long()


def time_ours(model, data, beam: int, out_len: int, use_cache: bool = True) -> float:
    cfg = SearchConfig(beam=beam, max_len=out_len, min_len=out_len, use_cache=use_cache)
    t0 = time.perf_counter()
    for src, _ in data:
        hyps = search(Seq2SeqAdapter(model, use_cache), src, cfg, out_len)
        assert all(len(h[0].tokens) == out_len for h in hyps)
    return time.perf_counter() - t0


def time_hf(model, data, beam: int, out_len: int) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode():
        for src, mask in data:
            out = model.generate(
                input_ids=src,
                attention_mask=mask,
                num_beams=beam,
                do_sample=False,
                max_new_tokens=out_len,
                min_new_tokens=out_len,
                length_penalty=0.6,
                early_stopping=False,
                use_cache=True,
            )
            assert out.size(1) == out_len + 1  # decoder start token + out_len
    return time.perf_counter() - t0


def best_of(repeats: int, *runs):
    """Each run's fastest time over ``repeats`` rounds, the runs alternating within a round (on a
    shared machine the load changes from second to second; alternation gives both the same luck)."""
    times = [[] for _ in runs]
    for _ in range(repeats):
        for t, run in zip(times, runs):
            t.append(run())
    return [min(t) for t in times]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["tiny", "base"], choices=list(SIZES))
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--base-sentences", type=int, default=None, help="fewer sentences for base (slow)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, nargs=2, default=(10, 30), help="source lengths, min max")
    p.add_argument("--out-len", type=int, default=30, help="fixed output length (tokens)")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    p.add_argument("--repeats", type=int, default=3, help="rounds; the fastest of each is reported")
    p.add_argument("--uncached", type=int, default=64, help="sentences for the uncached run (0 = skip)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the figures (sentences/s) here, with the machine and command")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"{machine()}, {args.threads} threads")
    print(f"{'size':5} {'search':7} {'sents':>5} {'aiayn s/s':>10} {'HF s/s':>8} {'ratio':>6} uncached s/s")
    rows = []
    for size in args.sizes:
        ours, hf = build_models(size)
        n = args.base_sentences if size == "base" and args.base_sentences else args.sentences
        sources = random_sources(n, *args.src_len, SIZES[size][4])
        data = list(batches(sources, args.batch))
        for beam in args.beams:
            time_ours(ours, data[:1], beam, 4)  # warm-up
            time_hf(hf, data[:1], beam, 4)
            t_ours, t_hf = best_of(
                args.repeats,
                partial(time_ours, ours, data, beam, args.out_len),
                partial(time_hf, hf, data, beam, args.out_len),
            )
            row = {"size": size, "beam": beam, "sentences": n, "aiayn_per_s": round(n / t_ours, 2),
                   "hf_per_s": round(n / t_hf, 2), "aiayn_vs_hf": round(t_hf / t_ours, 3)}  # fmt: skip
            uncached = ""
            if args.uncached:
                k = len(sources[: args.uncached])  # --uncached may ask for more than there are
                few = list(batches(sources[:k], args.batch))
                t_few, t_few_cached = best_of(
                    args.repeats,
                    partial(time_ours, ours, few, beam, args.out_len, use_cache=False),
                    partial(time_ours, ours, few, beam, args.out_len),
                )
                uncached = f"{k / t_few:8.1f} ({t_few / t_few_cached:.1f}x slower)"
                row["uncached_per_s"] = round(k / t_few, 2)
            name = "greedy" if beam == 1 else f"beam {beam}"
            rate = f"{n / t_ours:10.1f} {n / t_hf:8.1f} {t_hf / t_ours:6.2f}"
            print(f"{size:5} {name:7} {n:5d} {rate} {uncached}", flush=True)
            rows.append(row)
    if args.json:
        sizes = {"batch": args.batch, "out_len": args.out_len, "src_len": args.src_len}
        write_result(args.json, {"machine": machine(), "threads": args.threads, **sizes, "rows": rows})


if __name__ == "__main__":
    run_main(main)
