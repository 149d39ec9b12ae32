"""``aiayn demo``: a short end-to-end smoke run (build, train a few steps, report)."""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from aiayn import Transformer, TransformerConfig


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="run the main job on the bundled data")
    p.add_argument("--steps", type=int, default=200)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=64, n_heads=4, d_ff=128,
                            n_encoder_layers=2, n_decoder_layers=2, dropout=0.0)  # fmt: skip
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    t0 = time.time()
    for step in range(1, args.steps + 1):
        src = torch.randint(4, 20, (32, 10))  # task: copy the source
        bos = torch.full((32, 1), cfg.bos_id)
        logits = model(src, torch.cat([bos, src[:, :-1]], 1))
        loss = F.cross_entropy(logits.flatten(0, 1), src.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step:4d}  copy-task loss {loss.item():.3f}")
    print(f"done in {time.time() - t0:.1f}s")
    return 0
