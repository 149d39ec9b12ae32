"""One checkpoint, two decoders: aiayn's greedy and beam search against HF ``generate``, same weights.

An OPUS-MT-shaped MarianMTModel (opus-mt-de-en's sizes: d_model 512, 6+6 layers, 8 heads, d_ff
2048, SiLU, 58,101-token vocabulary; random weights, nothing downloaded) is saved and loaded into
aiayn with ``aiayn.from_pretrained``, or ``--model DIR`` names a real MarianMT directory. Both
decode the same batches of random source sentences to a fixed output length (eos forbidden until
then: ``min_len = max_len``, where aiayn's shrinking beam and HF's beam are the same algorithm,
see tests/interop/test_decoding.py), every output is checked to be token-identical, and the
wall-clock time of each (the best of ``--repeats`` alternating runs, which keeps other load on a
shared machine out of the ratio) is reported with the ratio HF / aiayn.

    python benchmarks/interop_vs_hf.py                          # CPU, 2 threads
    python benchmarks/interop_vs_hf.py --device cuda --sentences 1024 --batch 128
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from provenance import run_main, write_result

from aiayn.cli.demo import machine
from aiayn.decoding import SearchConfig, Seq2SeqAdapter, beam_search, greedy_search
from aiayn.interop import from_pretrained

OPUS_MT_DE_EN = dict(
    vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, activation_function="swish",
    max_position_embeddings=512, scale_embedding=True, pad_token_id=58100, decoder_start_token_id=58100,
    eos_token_id=0, forced_eos_token_id=None, dropout=0.0,
)  # fmt: skip


def load_pair(model_dir: str | None, device: str):
    """(HF model, aiayn model) with the same weights, both in eval mode on ``device``."""
    from transformers import MarianConfig, MarianMTModel

    if model_dir is None:  # saved only for aiayn to read it back: removed once loaded (≈ 300 MB)
        torch.manual_seed(0)
        hf = MarianMTModel(MarianConfig(**OPUS_MT_DE_EN))
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp)
            ours = from_pretrained(tmp, device)
    else:
        hf, ours = MarianMTModel.from_pretrained(model_dir), from_pretrained(model_dir, device)
    return hf.to(device).eval(), ours


def source_batches(n: int, batch: int, vocab: int, pad: int, eos: int, seed: int = 0) -> list[torch.Tensor]:
    """Random sentences of 10–30 tokens (eos last) in length order, right-padded into batches."""
    g = torch.Generator().manual_seed(seed)
    lengths = sorted(torch.randint(10, 31, (n,), generator=g).tolist())
    out = []
    for i in range(0, n, batch):
        rows = [torch.randint(1, pad, (k,), generator=g) for k in lengths[i : i + batch]]
        for r in rows:
            r[-1] = eos
        out.append(torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad))
    return out


def timed(fn, device: str) -> tuple[float, list]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0, result


def run_ours(model, data, beam: int, out_len: int, alpha: float) -> list[list[int]]:
    out = []
    for src in data:
        if beam == 1:
            hyps = greedy_search(Seq2SeqAdapter(model), src, out_len, SearchConfig(beam=1, min_len=out_len))
        else:
            config = SearchConfig(beam=beam, lenpen=alpha, lenpen_kind="simple", min_len=out_len)
            hyps = beam_search(Seq2SeqAdapter(model), src, out_len, config)
        out += [h[0].tokens for h in hyps]
    return out


def run_hf(model, data, beam: int, out_len: int, alpha: float, pad: int) -> list[list[int]]:
    out = []
    with torch.inference_mode():
        for src in data:
            fixed = dict(max_new_tokens=out_len, min_new_tokens=out_len)
            mask = (src != pad).long()
            seq = model.generate(input_ids=src, attention_mask=mask, num_beams=beam, do_sample=False,
                                 length_penalty=alpha, **fixed)  # fmt: skip
            out += seq[:, 1:].tolist()  # without the decoder start token
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default=None, help="a MarianMT directory (default: random opus-mt-de-en shapes)"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out-len", type=int, default=20, help="fixed output length in tokens")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3, help="alternating timed runs; the best counts")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    hf, ours = load_pair(args.model, args.device)
    c = ours.config
    data = [b.to(args.device) for b in source_batches(args.sentences, args.batch, c.src_vocab_size, c.pad_id,
                                                      c.eos_id)]  # fmt: skip
    cuda = args.device.startswith("cuda")
    where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}" if cuda else machine()
    print(f"{where}, {args.threads} threads; {args.sentences} sentences, "
          f"batch {args.batch}, {args.out_len} output tokens each")  # fmt: skip
    print(f"{'search':8} {'aiayn s':>8} {'HF s':>8} {'HF/aiayn':>8}  outputs")
    results = []
    for beam in args.beams:
        run_ours(ours, data[:1], beam, 2, args.lenpen), run_hf(hf, data[:1], beam, 2, args.lenpen, c.pad_id)
        t_ours = t_hf = float("inf")
        for _ in range(args.repeats):
            t, got = timed(lambda b=beam: run_ours(ours, data, b, args.out_len, args.lenpen), args.device)
            t_ours = min(t_ours, t)
            t, ref = timed(
                lambda b=beam: run_hf(hf, data, b, args.out_len, args.lenpen, c.pad_id), args.device
            )
            t_hf = min(t_hf, t)
        same = sum(a == b for a, b in zip(got, ref))
        name = "greedy" if beam == 1 else f"beam {beam}"
        print(f"{name:8} {t_ours:8.2f} {t_hf:8.2f} {t_hf / t_ours:8.2f}  {same}/{len(ref)} token-identical",
              flush=True)  # fmt: skip
        results.append(dict(search=name, aiayn_s=t_ours, hf_s=t_hf, ratio=t_hf / t_ours, identical=same,
                            sentences=len(ref)))  # fmt: skip
    if args.json:
        # temp file + rename: nothing half-written
        write_result(args.json, dict(device=where, args=vars(args), results=results))


if __name__ == "__main__":
    run_main(main)
