r"""Training throughput: aiayn's training step against the plain recipe a user would write instead.

The plain recipe is ``torch.nn.Transformer`` + ``nn.Embedding`` (×√d_model) + sinusoidal positions + an
untied ``nn.Linear`` head (``--plain-tied``: one embedding shared by source, target and head, as in
aiayn's default and the paper's §3.4, so both have the same parameters) +
``F.cross_entropy(label_smoothing=0.1, ignore_index=pad)``, trained with ``torch.optim.Adam(fused=True)``
(``--no-fused-plain``: Adam's default, the peer until 2026-12-05); aiayn steps with the
optimizer ``aiayn train`` builds (``make_optimizer``, fused too), same hyper-parameters.
Dropout is the paper's on both sides (§5.4: on the embeddings and each sublayer's
output, p = 0.1): ``nn.Transformer(dropout=0.1)`` also drops attention weights and the feed-forward's
inner activations, more work than aiayn's default does, which is switched off unless ``--plain-dropout
nn`` keeps it (measured so before 2026-12-04). Both see the same batches (lengths drawn like Multi30k's,
bucketed to a token budget, padding included), in the same precision, and alternate step by step in one
process so that machine noise hits both alike (on CUDA, after one untimed step on every batch: a shape's
first step there pays the allocator's growth and the kernels' choice). Reported: target tokens/s (median
over steps, and over all steps together: batches of different lengths take different paths), the ratios,
the parameters, and peak memory of each implementation measured alone in a child process (RSS growth on
the CPU, max allocated on CUDA, each above what models, optimizers and batches hold). ``--profile`` (CPU)
also measures, under the PyTorch profiler after the timed steps, the share of each step spent in matrix
products, and from it the ceiling of the ratio: the plain step's time over aiayn's products alone, which
no saving outside the products can pass (both sides do the same products, on the same machine).

    python benchmarks/train_vs_nn.py --size tiny --precision fp32
    python benchmarks/train_vs_nn.py --size base --precision bf16 --steps 6
    python benchmarks/train_vs_nn.py --profile     # + the matrix products' share and the ceiling
    # as a CPU without AVX-512 would run it (what the file's isa_limits records):
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
        python benchmarks/train_vs_nn.py
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from provenance import run_main, write_result
from torch import nn

from aiayn import Transformer, TransformerConfig
from aiayn.cli.demo import ISA_LIMITS, machine
from aiayn.data.batching import TranslationBatch
from aiayn.modules.embedding import sinusoidal_table
from aiayn.training.config import TrainConfig
from aiayn.training.criteria import label_smoothed_loss
from aiayn.training.optim import make_optimizer

SIZES = {
    "tiny": dict(d_model=128, n_heads=4, d_ff=256, layers=4, vocab=10000),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, layers=6, vocab=37000),
}
PAD, BOS, EOS = 0, 1, 2
# the operators that run matrix products on the CPU (self time: matmul, linear dispatch to these)
MATRIX_PRODUCTS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::addbmm")


class PlainRecipe(nn.Module):
    """What a user writes with torch.nn: embeddings, positions, nn.Transformer, a linear head."""

    def __init__(self, d_model, n_heads, d_ff, layers, vocab, tied=False, nn_dropout=False):
        super().__init__()
        self.src_emb = nn.Embedding(vocab, d_model, PAD)
        self.tgt_emb = self.src_emb if tied else nn.Embedding(vocab, d_model, PAD)
        self.register_buffer("pe", sinusoidal_table(1024, d_model))
        self.transformer = nn.Transformer(
            d_model, n_heads, layers, layers, d_ff, dropout=0.1, batch_first=True
        )
        if not nn_dropout:  # the paper's dropout only, as aiayn's (attn_dropout = ff_dropout = 0)
            for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
                for attention in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                    if attention is not None:
                        attention.dropout = 0.0  # on the attention weights
                layer.dropout = nn.Identity()  # inside the feed-forward
        self.generator = nn.Linear(d_model, vocab, bias=not tied)
        if tied:
            self.generator.weight = self.src_emb.weight
        self.scale = math.sqrt(d_model)
        self.dropout = nn.Dropout(0.1)

    def embed(self, emb, ids):
        return self.dropout(emb(ids) * self.scale + self.pe[: ids.size(1)])

    def forward(self, src, tgt):
        # bool like the padding masks (nn.Transformer's convention: True = may not attend); a float
        # mask beside bool padding masks takes torch's deprecated mixed-mask path
        mask = torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=tgt.device).triu(1)
        h = self.transformer(
            self.embed(self.src_emb, src), self.embed(self.tgt_emb, tgt), tgt_mask=mask,
            src_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt == PAD,
            memory_key_padding_mask=src == PAD,
        )  # fmt: skip
        return self.generator(h)


def batches(n: int, vocab: int, max_tokens: int, seed: int = 0):
    """Token-budget batches with Multi30k-like lengths (mean ≈ 13 subwords, long tail)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(8, 30, (1,), generator=g))
        b = max_tokens // (length + 1)
        src_len = (torch.randint(-4, 1, (b,), generator=g) + length).clamp(min=3)
        tgt_len = (torch.randint(-4, 1, (b,), generator=g) + length).clamp(min=3)
        src = torch.full((b, length + 1), PAD)
        tgt_in, tgt_out = torch.full((b, length + 1), PAD), torch.full((b, length + 1), PAD)
        for i in range(b):
            s, t = int(src_len[i]), int(tgt_len[i])
            src[i, :s] = torch.randint(4, vocab, (s,), generator=g)
            src[i, s] = EOS
            y = torch.randint(4, vocab, (t,), generator=g)
            tgt_in[i, 0], tgt_in[i, 1 : t + 1] = BOS, y
            tgt_out[i, :t], tgt_out[i, t] = y, EOS
        out.append((src, tgt_in, tgt_out))
    return out


def matmul_gflops(device: torch.device, n: int = 1024, repeat: int = 20) -> float:
    """The machine's fp32 matrix-product speed now (GFLOP/s of n×n products): the figure that says
    how fast this machine was while the benchmark ran, since 2-core VMs differ and vary."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    for _ in range(3):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return round(2 * n**3 * repeat / (time.perf_counter() - t0) / 1e9, 1)


def child_peak(name: str) -> float:
    """Peak memory of 3 training steps of one implementation, measured in a fresh process: on the
    CPU, max RSS above the RSS once models, optimizers and batches exist; on CUDA, max allocated above
    what is allocated then (the child builds both models, as the parent does)."""
    cmd = [sys.executable, *sys.argv, "--memory-of", name]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


def product_share(step, batches) -> float:
    """The fraction of ``step``'s CPU time (over ``batches``) spent in matrix products, under the
    PyTorch profiler: self time, so an operator is counted once, whichever path dispatched it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            step(batch)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return sum(e.self_cpu_time_total for e in events if e.key in MATRIX_PRODUCTS) / total


def rss_mb(field: str = "VmHWM") -> float:
    """This process's peak (VmHWM) or current (VmRSS) resident memory. Unlike ru_maxrss, VmHWM
    starts afresh in a new program, so the parent's peak does not leak into the child's figure."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=SIZES, default="tiny")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--steps", type=int, default=20, help="measured steps per implementation")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument(
        "--fused-plain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the plain recipe steps with torch's fused Adam, as aiayn does (the stronger peer; "
        "--no-fused-plain: Adam's default, as before 2026-12-05)",
    )
    ap.add_argument(
        "--plain-tied",
        action="store_true",
        help="the plain recipe shares one embedding for source, target and head (as aiayn)",
    )
    ap.add_argument(
        "--plain-dropout",
        choices=["paper", "nn"],
        default="paper",
        help="paper: the plain recipe drops what aiayn drops (embeddings, sublayer outputs); nn: "
        "nn.Transformer's own dropout on attention weights and inside the feed-forward too",
    )
    ap.add_argument("--profile", action="store_true", help="also the matrix products' share of a step (CPU)")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--memory-of", choices=["aiayn", "nn.Transformer"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        ap.error(f"--steps {args.steps} --warmup {args.warmup}: at least one step measured, warm-up ≥ 0")
    if args.profile and args.device != "cpu":
        ap.error(f"--profile measures CPU time; --device {args.device} runs on an accelerator (drop one)")
    if args.threads:
        torch.set_num_threads(args.threads)
    s, device = SIZES[args.size], torch.device(args.device)
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=s["vocab"], tgt_vocab_size=s["vocab"], d_model=s["d_model"],
                            n_heads=s["n_heads"], d_ff=s["d_ff"], n_encoder_layers=s["layers"],
                            n_decoder_layers=s["layers"])  # fmt: skip
    ours = Transformer(cfg).to(device)
    plain = PlainRecipe(s["d_model"], s["n_heads"], s["d_ff"], s["layers"], s["vocab"], args.plain_tied,
                        args.plain_dropout == "nn")  # fmt: skip
    plain = plain.to(device)
    train_cfg = TrainConfig(optimizer="adam", beta1=0.9, beta2=0.98, adam_eps=1e-9, weight_decay=0.0)
    opts = {
        "aiayn": make_optimizer(ours, train_cfg),  # what `aiayn train` steps with
        "nn.Transformer": torch.optim.Adam(
            plain.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True if args.fused_plain else None
        ),
    }
    for group in opts["aiayn"].param_groups:
        group["lr"] = 1e-4  # the trainer sets it from the schedule at every update
    data = [
        tuple(t.to(device) for t in b) for b in batches(args.warmup + args.steps, s["vocab"], args.max_tokens)
    ]
    amp = (torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16"
           else contextlib.nullcontext())  # fmt: skip

    def step_aiayn(batch):
        with amp:
            src, tgt_in, tgt_out = batch
            loss, _, n = label_smoothed_loss(ours, TranslationBatch(src, tgt_in, tgt_out), 0.1)
        (loss / n).backward()

    def step_plain(batch):
        src, tgt_in, tgt_out = batch
        with amp:
            logits = plain(src, tgt_in)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=PAD,
                                   label_smoothing=0.1)  # fmt: skip
        loss.backward()

    steps = {"aiayn": step_aiayn, "nn.Transformer": step_plain}

    def update(name, batch):  # forward, backward and the optimizer's step
        steps[name](batch)
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)

    if args.memory_of:  # a child process: the peak memory of one implementation alone
        before = rss_mb("VmRSS")
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() / 2**20
        for batch in data[:3]:
            update(args.memory_of, batch)
        peak = (torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else rss_mb()) - before
        print(json.dumps({"peak_mb": round(peak, 1)}))
        return
    times: dict[str, list[float]] = {k: [] for k in steps}
    warm_pass = device.type == "cuda"
    if warm_pass:  # a shape's first step pays allocator growth and kernel choice: run each once
        for batch in data:
            for name in steps:
                update(name, batch)
    speed_before = matmul_gflops(device)  # the machine's speed beside the timed steps, not after the children
    for i, batch in enumerate(data):
        for name in steps:  # alternate, so both see the same machine state
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            update(name, batch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    speed_after = matmul_gflops(device)
    peak = {name: child_peak(name) for name in steps}
    tokens = statistics.median(int((b[2] != PAD).sum()) for b in data[args.warmup :])  # the timed ones
    result = {"size": args.size, "precision": args.precision, "device": str(device), "steps": args.steps,
              "threads": torch.get_num_threads(), "target_tokens_per_step": tokens,
              "machine": f"{machine()}, {torch.get_num_threads()} threads",
              "matmul_gflops": round((speed_before + speed_after) / 2, 1),  # right before and after the steps
              "matmul_gflops_before_after": [speed_before, speed_after],
              "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # ATen's vector kernels
              "isa_limits": {k: os.environ[k] for k in ISA_LIMITS if k in os.environ},
              "torch": torch.__version__,
              "warm_pass": warm_pass,  # every batch run once untimed before the timing (every shape warm)
              "plain_optimizer": "fused Adam" if args.fused_plain else "Adam",
              "plain_embeddings": "shared and tied" if args.plain_tied else "separate, untied head",
              "plain_dropout": args.plain_dropout,  # "nn": attention weights and feed-forward too
              "parameters": {"aiayn": sum(p.numel() for p in ours.parameters()),
                             "nn.Transformer": sum(p.numel() for p in plain.parameters())}}  # fmt: skip
    all_tokens = sum(int((b[2] != PAD).sum()) for b in data[args.warmup :])
    for name, t in times.items():
        med = statistics.median(t)
        result[name] = {"tokens_per_s": round(tokens / med), "step_s": round(med, 4),
                        "tokens_per_s_all_steps": round(all_tokens / sum(t)),
                        "peak_mem_mb": peak[name]}  # fmt: skip
    result["speedup"] = round(result["aiayn"]["tokens_per_s"] / result["nn.Transformer"]["tokens_per_s"], 2)
    result["speedup_all_steps"] = round(sum(times["nn.Transformer"]) / sum(times["aiayn"]), 2)  # total time
    ratios = [b / a for a, b in zip(times["aiayn"], times["nn.Transformer"])]  # same batch, back to back
    result["speedup_median_of_pairs"] = round(statistics.median(ratios), 2)
    if args.profile:  # after the timing, so that the profiler's overhead touches none of it
        for name in steps:
            share = product_share(functools.partial(update, name), data[args.warmup : args.warmup + 5])
            result[name]["matrix_product_share"] = round(share, 3)
            result[name]["matrix_product_s"] = round(share * result[name]["step_s"], 4)  # of the median step
        # no saving outside the products can make aiayn's step shorter than its products alone
        ceiling = result["nn.Transformer"]["step_s"] / result["aiayn"]["matrix_product_s"]
        result["speedup_ceiling"] = round(ceiling, 2)
    print(json.dumps(result, indent=2))
    if args.json:
        write_result(args.json, result)  # temp file + rename: nothing half-written


if __name__ == "__main__":
    run_main(main)
