"""How long a small encoder takes to read context: replaced-token detection from the first update.

A diagnostic for issue 59, where masked-LM and replaced-token detection pre-training on IMDb stayed
at their context-free loss for a CPU hour. With a fixed unigram generator (``data/replacing.py``) a
token's identity says nothing about whether it was replaced (each piece is replaced 15% of the time),
so the loss of a detector that does not read context is the entropy of the labels (about 0.42 nats);
anything below it is context read. This trains the same 2-layer encoder (d_model 128, 4 heads) on the
same batches (the first ``--reviews`` unlabelled reviews, ``--length``-piece blocks, 4,096 pieces a
batch, AdamW, 20 warm-up updates) in four forms and prints the training loss every 50 updates:

- ``torch``: ``nn.TransformerEncoder`` (pre-norm, GELU) with learned positions: a reference nobody
  here wrote, so a plateau it shares is the objective's, not a bug of aiayn's layers;
- ``torch-alibi``: the same with ALiBi's symmetric distance bias instead of positions (attention
  starts local);
- ``aiayn``, ``aiayn-sinusoidal``: ``EncoderModel`` with learned or the paper's positions.

    python benchmarks/pretraining_plateau.py PATH/imdb runs/reproduce-encoder/imdb-rtd/tokenizer
    python benchmarks/pretraining_plateau.py PATH/imdb TOKENIZER --arms aiayn --steps 800 --lr 3e-3
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provenance import run_main, write_result  # noqa: E402

from aiayn import EncoderConfig, EncoderModel  # noqa: E402
from aiayn.data import load_tokenizer  # noqa: E402
from aiayn.data.batching import collate_sequences  # noqa: E402
from aiayn.data.replacing import piece_distribution, replace_tokens  # noqa: E402

D, H, FF, N_LAYERS, BATCH_PIECES = 128, 4, 512, 2, 4096


class TorchEncoder(nn.Module):
    """Embedding (+ learned positions, or ALiBi) -> LayerNorm -> nn.TransformerEncoder -> LayerNorm
    -> ELECTRA's head."""

    def __init__(self, vocab_size: int, alibi: bool = False):
        super().__init__()
        self.alibi = alibi
        self.tokens, self.positions = nn.Embedding(vocab_size, D), nn.Embedding(512, D)
        self.norm, self.final = nn.LayerNorm(D), nn.LayerNorm(D)
        layer = nn.TransformerEncoderLayer(D, H, FF, 0.0, "gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, N_LAYERS, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.Linear(D, 1))

    def detect(self, ids: torch.Tensor) -> torch.Tensor:
        """Shape: ids (B, T) -> (B, T)"""
        T = ids.size(1)
        if not self.alibi:
            h = self.encoder(self.norm(self.tokens(ids) + self.positions(torch.arange(T))))
        else:  # a float mask is added to the scores: -slope_h · |i - j|
            slopes = torch.tensor([2 ** (-8 * (k + 1) / H) for k in range(H)])
            distance = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs().float()
            bias = -(slopes[:, None, None] * distance)  # (H, T, T)
            h = self.encoder(self.norm(self.tokens(ids)), mask=bias.repeat(ids.size(0), 1, 1))
        return self.head(self.final(h)).squeeze(-1)


def aiayn_encoder(vocab_size: int, positional: str) -> EncoderModel:
    c = EncoderConfig(d_model=D, n_heads=H, d_ff=FF, n_layers=N_LAYERS, dropout=0.0, activation="gelu",
                      positional=positional, emb_scale="none", embed_norm=True, norm_first=True,
                      detector=True, vocab_size=vocab_size, max_len=512)  # fmt: skip
    return EncoderModel(c)


def train(model: nn.Module, blocks: np.ndarray, probs: np.ndarray, length: int, steps: int, lr: float):
    """The training loss, averaged over each 50 updates."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng, losses, curve, t0 = np.random.default_rng(0), [], [], time.perf_counter()
    for step in range(1, steps + 1):
        rows = [blocks[i] for i in rng.integers(0, len(blocks), BATCH_PIECES // length)]
        inputs, labels = replace_tokens(collate_sequences(rows, length, 0, 1, 2), 0.15, probs, rng)
        scored = labels >= 0
        for group in opt.param_groups:
            group["lr"] = lr * min(1, step / 20)
        loss = F.binary_cross_entropy_with_logits(model.detect(inputs)[scored], labels[scored].float())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0:
            curve.append({"step": step, "loss": round(float(np.mean(losses[-50:])), 4),
                          "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
            print(curve[-1], flush=True)
    return curve


def label_entropy(probs: np.ndarray, p: float = 0.15) -> float:
    """The loss of a detector that reads no context: the entropy of "replaced", which a chosen piece
    is unless the generator draws the piece itself (Σ probs² of the time, pieces drawn as they occur)."""
    r = p * (1 - float((probs**2).sum()))
    return round(-(r * np.log(r) + (1 - r) * np.log(1 - r)), 4)


def cpu_name() -> str:
    """The CPU's model name (Linux), for the results."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("imdb", type=Path, help="folder with unsup.txt.gz")
    ap.add_argument(
        "tokenizer", type=Path, help="a run's tokenizer directory (e.g. of recipes/imdb-rtd.toml)"
    )
    arms = ["torch", "torch-alibi", "aiayn", "aiayn-sinusoidal"]
    ap.add_argument("--arms", nargs="+", default=arms, choices=arms)
    ap.add_argument("--reviews", type=int, default=6000)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if min(args.reviews, args.length - 2, args.steps) < 1:
        ap.error("--reviews and --steps must be at least 1, --length at least 3")
    if not (args.imdb / "unsup.txt.gz").is_file():
        ap.error(f"{args.imdb / 'unsup.txt.gz'}: no such file (give the folder holding IMDb's unsup.txt.gz)")
    tok = load_tokenizer(args.tokenizer)
    with gzip.open(args.imdb / "unsup.txt.gz", "rt", encoding="utf-8") as f:
        docs = tok.encode_batch(list(itertools.islice(f, args.reviews)))
    stream = np.concatenate([np.r_[np.asarray(d, np.int64), tok.eos_id] for d in docs])
    n = args.length - 2
    blocks = stream[: len(stream) // n * n].reshape(-1, n)
    probs = piece_distribution(stream, tok.vocab_size, "unigram")
    V = tok.vocab_size
    builders = {"torch": lambda: TorchEncoder(V), "torch-alibi": lambda: TorchEncoder(V, True),
                "aiayn": lambda: aiayn_encoder(V, "learned"),
                "aiayn-sinusoidal": lambda: aiayn_encoder(V, "sinusoidal")}  # fmt: skip
    out = {"machine": cpu_name(), "torch": torch.__version__, "threads": args.threads, "blocks": len(blocks),
           "length": args.length, "steps": args.steps, "lr": args.lr,
           "label_entropy_nats": label_entropy(probs), "arms": {}}  # fmt: skip
    for arm in args.arms:
        torch.manual_seed(0)
        print(arm, flush=True)
        out["arms"][arm] = train(builders[arm](), blocks, probs, args.length, args.steps, args.lr)
    if args.json:
        write_result(args.json, out)  # temp file + rename: nothing half-written
    return 0


if __name__ == "__main__":
    run_main(main)
