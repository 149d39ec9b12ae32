"""The decoding cost of bidirectional decoding: two passes (right to left, then left to right with the
fourth sublayer) against one, same sizes, same sources, side by side in one run.

Random models (no training needed for a cost): the plain recipe's sizes (4+4 layers, d_model 128)
and the same model with ``bidirectional=True``; the left-to-right outputs are forced to a fixed length
(``min_len = max_len``) so that both do the same number of steps whatever the weights predict. The
right-to-left pass runs the training cache's search (``memory_search``: no ``min_len``), up to the
source's length + ``R2L_MARGIN`` tokens; a random model seldom ends it sooner.

    python benchmarks/bidirectional_decoding.py                 # greedy and beam 4, 256 sentences
    python benchmarks/bidirectional_decoding.py --threads 1 --sentences 128
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from provenance import run_main, write_result

from aiayn import Transformer, TransformerConfig, build_transformer
from aiayn.cli.demo import machine
from aiayn.decoding import SearchConfig, Seq2SeqAdapter, search
from aiayn.decoding.bidirectional import BidirectionalAdapter


def model(bidirectional: bool) -> Transformer:
    torch.manual_seed(0)
    sizes = dict(n_encoder_layers=4, n_decoder_layers=4, d_model=128, n_heads=4, d_ff=256, dropout=0.0)
    cfg = TransformerConfig(src_vocab_size=8000, tgt_vocab_size=8000, bidirectional=bidirectional, **sizes)
    return build_transformer(cfg).eval()


def sentences_per_s(m: Transformer, src: torch.Tensor, beam: int, length: int, batch: int) -> float:
    config = SearchConfig(beam=beam, max_len=length, min_len=length, lenpen=0.0)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(src), batch):
            chunk = src[i : i + batch]
            limits = torch.full((len(chunk),), length)
            adapter = BidirectionalAdapter(m, config, limits) if m.config.bidirectional else Seq2SeqAdapter(m)
            search(adapter, chunk, config, limits)
    return len(src) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=256)
    ap.add_argument("--length", type=int, default=20, help="source and output tokens")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    src = torch.randint(4, 8000, (args.sentences, args.length))
    src[:, -1] = 2
    plain, bidi = model(False), model(True)
    for m in (plain, bidi):  # warm-up: first-call costs (allocations, kernel choice) timed in neither arm
        for beam in (1, 4):  # greedy and beam search take different paths
            sentences_per_s(m, src[: args.batch], beam, args.length, args.batch)
    rows = []
    for beam in (1, 4):
        one = sentences_per_s(plain, src, beam, args.length, args.batch)
        two = sentences_per_s(bidi, src, beam, args.length, args.batch)
        row = {
            "beam": beam,
            "plain_sentences_per_s": round(one, 1),
            "bidirectional_sentences_per_s": round(two, 1),
        }
        rows.append({**row, "cost_ratio": round(one / two, 2)})
        print(json.dumps(rows[-1]), flush=True)
    out = {"machine": machine(), "threads": torch.get_num_threads(), "sentences": args.sentences,
           "length": args.length, "batch": args.batch, "rows": rows}  # fmt: skip
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}))
    if args.json:
        write_result(args.json, out)  # temp file + rename: nothing half-written
    return 0


if __name__ == "__main__":
    run_main(main)
