"""The training loop shared by every task: accumulate, clip, step, log, evaluate, checkpoint.

One ``Trainer`` per process. Under ``torchrun`` each rank trains on its shard of every epoch
(DistributedDataParallel averages gradients); only rank 0 evaluates and writes files.

The loss of an update is the sum over its target tokens divided by the number of target tokens
in the whole update (all micro-batches, all ranks), so accumulation and data parallelism give the
same gradient as one big batch.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from aiayn.atomic import remove_temporaries, write_json, write_text
from aiayn.models.common import count_parameters
from aiayn.training import checkpoint as ckpt
from aiayn.training.config import TrainConfig, to_dict
from aiayn.training.distributed import (
    all_reduce_sum,
    barrier,
    init_distributed,
    resolve_device,
    shutdown,
)
from aiayn.training.schedule import Schedule
from aiayn.training.task import Batch, get_task

TRAIN_CONFIG = "train_config.json"
METRICS = "metrics.jsonl"
# fields that may change when a run is resumed: they do not change what is computed
RESUMABLE_CHANGES = {"max_steps", "max_epochs", "max_minutes", "patience", "eval_every", "log_every",
                     "keep_last", "progress", "device", "threads", "tensorboard", "eval_max_sentences",
                     "compile"}  # fmt: skip


class TrainingDiverged(RuntimeError):
    pass


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam(β1, β2, ε) as in the paper; weight decay only on matrices (not biases, norms)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(groups, lr=0.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


def make_schedule(cfg: TrainConfig, d_model: int) -> Schedule:
    return Schedule(cfg.schedule, cfg.lr, cfg.warmup, d_model, cfg.min_lr, cfg.decay_steps or cfg.max_steps)


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("precision=fp16 needs a CUDA device; use bf16 on CPU")
    return torch.autocast(device.type, dtype=dtype)


def check_resume_compatible(run_dir: Path, cfg: TrainConfig) -> None:
    path = run_dir / TRAIN_CONFIG
    if not path.is_file():
        raise ValueError(f"cannot resume: {path} is missing ({run_dir} is not a training run)")
    saved, now = json.loads(path.read_text(encoding="utf-8")), to_dict(cfg)
    changed = sorted(k for k in now if k not in RESUMABLE_CHANGES and saved.get(k) != now[k])
    if changed:
        k = changed[0]
        raise ValueError(
            f"cannot resume {run_dir}: {k} was {saved.get(k)!r}, now {now[k]!r} "
            f"({len(changed)} incompatible field(s): {', '.join(changed)}); use a new out_dir"
        )


class Trainer:
    def __init__(self, cfg: TrainConfig, resume: bool = False):
        self.cfg = cfg
        self.run_dir = Path(cfg.out_dir)
        self.device = resolve_device(cfg.device)
        self.dist = init_distributed(self.device)
        if self.dist.enabled and self.device.type == "cuda":
            self.device = resolve_device(cfg.device, self.dist.local_rank)
            torch.cuda.set_device(self.device)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        autocast(self.device, cfg.precision)  # fail early on an impossible precision
        latest = ckpt.latest_checkpoint(self.run_dir)
        existing = latest is not None or (self.run_dir / TRAIN_CONFIG).exists()
        fresh = not self.run_dir.exists()
        barrier(self.dist)  # every rank looks before rank 0 writes
        if resume:
            check_resume_compatible(self.run_dir, cfg)
        elif existing:
            raise ValueError(f"{self.run_dir} already holds a run: pass --resume, or choose another out_dir")
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            remove_temporaries(self.run_dir)
            write_json(self.run_dir / TRAIN_CONFIG, to_dict(cfg))
        barrier(self.dist)
        try:
            self._setup(resume, latest)
        except BaseException:
            if fresh and self.dist.is_main:  # a run that never started leaves nothing behind
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    def _setup(self, resume: bool, latest: Path | None) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.task = get_task(cfg.task)(cfg, self.run_dir, self.dist)
        self.model = self.task.build_model().to(self.device)
        self.optimizer = make_optimizer(self.model, cfg)
        self.schedule = make_schedule(cfg, self.model.config.d_model)
        self.scaler = torch.amp.GradScaler("cuda", enabled=cfg.precision == "fp16")
        self.step, self.best, self.bad_evals, self.elapsed = 0, None, 0, 0.0
        torch.manual_seed(cfg.seed + 1000 * self.dist.rank)  # dropout masks differ per rank
        if resume and latest is not None:
            state = ckpt.load_checkpoint(latest, self.model, self.optimizer)  # restores rank 0's RNG
            self.step, self.best, self.bad_evals = state["step"], state["best"], state["bad_evals"]
            self.elapsed = state["elapsed"]
            self.task.sampler.load_state_dict(state["sampler"])
            if state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            if self.dist.rank:
                torch.manual_seed(cfg.seed + 1000 * self.dist.rank + self.step)
        elif resume and self.dist.is_main:
            print(f"{self.run_dir}: no checkpoint yet, starting from step 0", file=sys.stderr)
        self.train_model = self.model
        if cfg.compile:
            self.train_model = torch.compile(self.model)
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = DistributedDataParallel(self.train_model, device_ids=ids)
        self._stop_signal: str | None = None
        self.tb = None
        self._truncate_metrics()

    # -- bookkeeping ----------------------------------------------------------------------------
    def _truncate_metrics(self) -> None:
        """After a resume, drop metrics lines logged after the checkpoint (they will be redone)."""
        path = self.run_dir / METRICS
        if self.dist.is_main and path.exists():
            lines = path.read_text(encoding="utf-8").splitlines()
            kept = [ln for ln in lines if ln.strip() and json.loads(ln).get("step", 0) <= self.step]
            write_text(path, "".join(ln + "\n" for ln in kept))

    def log(self, record: dict) -> None:
        if self.dist.is_main:
            with open(self.run_dir / METRICS, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if self.tb is not None:
                for k, v in record.items():
                    if k not in ("step", "split") and isinstance(v, (int, float)):
                        self.tb.add_scalar(f"{record.get('split', 'train')}/{k}", v, record["step"])

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = signal.Signals(signum).name

    # -- one update -----------------------------------------------------------------------------
    def train_step(self, batches: list[Batch]) -> dict[str, float]:
        """One optimizer update over ``update_freq`` micro-batches."""
        cfg, model = self.cfg, self.train_model
        model.train()
        lr = self.schedule(self.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batches = [b.to(self.device, non_blocking=True) for b in batches]
        n_tokens = sum(self.task.n_targets(b) for b in batches)
        total = all_reduce_sum(torch.tensor(float(n_tokens), device=self.device), self.dist).item()
        scale = self.dist.world_size / total  # DDP averages over ranks
        loss_sum = nll_sum = 0.0
        for i, batch in enumerate(batches):
            sync = i == len(batches) - 1 or not self.dist.enabled
            with contextlib.nullcontext() if sync else model.no_sync(), autocast(self.device, cfg.precision):
                loss, nll, _ = self.task.loss(model, batch, cfg.label_smoothing)
            self.scaler.scale(loss * scale).backward()
            loss_sum, nll_sum = loss_sum + loss.detach(), nll_sum + nll.detach()
        self.scaler.unscale_(self.optimizer)
        grad_norm = nn.utils.clip_grad_norm_(
            self.model.parameters(), cfg.clip_norm if cfg.clip_norm > 0 else float("inf")
        )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        loss_value = float(loss_sum) / n_tokens
        if not math.isfinite(loss_value):
            raise TrainingDiverged(
                f"loss is {loss_value} at step {self.step}; the last good checkpoint is "
                f"{ckpt.latest_checkpoint(self.run_dir) or 'none'} (try a lower lr or clip_norm)"
            )
        return {"loss": loss_value, "nll": float(nll_sum) / n_tokens, "lr": lr,
                "grad_norm": float(grad_norm), "tokens": n_tokens}  # fmt: skip

    # -- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        model = self.model
        model.eval()
        loss_sum = nll_sum = n = 0.0
        for batch in self.task.valid_batches():
            batch = batch.to(self.device)
            with autocast(self.device, self.cfg.precision):
                loss, nll, k = self.task.loss(model, batch, self.cfg.label_smoothing)
            loss_sum, nll_sum, n = loss_sum + float(loss), nll_sum + float(nll), n + int(k)
        out = {"loss": loss_sum / n, "nll": nll_sum / n, "ppl": math.exp(min(nll_sum / n, 50.0))}
        with autocast(self.device, self.cfg.precision):
            out.update(self.task.extra_metrics(model, self.device))
        return out

    def _improved(self, metrics: dict[str, float]) -> bool:
        score = self.task.score(metrics)
        if self.best is None or score > self.best:
            self.best, self.bad_evals = score, 0
            return True
        self.bad_evals += 1
        return False

    def save(self, improved: bool) -> Path | None:
        if not self.dist.is_main:
            return None
        state = {"best": self.best, "bad_evals": self.bad_evals, "elapsed": self.elapsed,
                 "sampler": self.task.sampler.state_dict(), "scaler": self.scaler.state_dict() or None,
                 "epoch": self.task.epoch}  # fmt: skip
        path = ckpt.save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, state,
                                    self.task.save_tokenizers, self.task.model_meta())  # fmt: skip
        if improved or not (self.run_dir / "best").exists():
            ckpt.mark_best(self.run_dir, path)
        ckpt.prune(self.run_dir, self.cfg.keep_last)
        return path

    def evaluate_and_save(self) -> dict[str, float]:
        metrics = self.evaluate() if self.dist.is_main else {}
        improved = self._improved(metrics) if self.dist.is_main else False
        if self.dist.is_main:
            self.log({"step": self.step, "split": "valid", **metrics, "elapsed": round(self.elapsed, 1)})
        self.save(improved)
        flag = torch.tensor([float(self.bad_evals)], device=self.device)
        self.bad_evals = int(all_reduce_sum(flag, self.dist).item()) if self.dist.enabled else self.bad_evals
        barrier(self.dist)
        return metrics

    # -- the loop -------------------------------------------------------------------------------
    def fit(self) -> dict:
        cfg = self.cfg
        if cfg.tensorboard and self.dist.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        if self.dist.is_main:
            n = count_parameters(self.model)
            print(f"aiayn train: {n / 1e6:.2f}M parameters, device {self.device}, "
                  f"{self.dist.world_size} process(es), run {self.run_dir}", file=sys.stderr)  # fmt: skip
        bar = tqdm(total=cfg.max_steps, initial=self.step, disable=not (cfg.progress and self.dist.is_main),
                   dynamic_ncols=True, desc="train")  # fmt: skip
        batches, reason = self.task.train_batches(), "max_steps"
        window_tokens, window_start, last_eval = 0, time.perf_counter(), self.step
        try:
            while self.step < cfg.max_steps:
                if cfg.max_epochs and self.task.epoch >= cfg.max_epochs:
                    reason = "max_epochs"
                    break
                t0 = time.perf_counter()
                stats = self.train_step([next(batches) for _ in range(cfg.update_freq)])
                self.elapsed += time.perf_counter() - t0
                window_tokens += stats["tokens"]
                bar.update(1)
                if self.step % cfg.log_every == 0:
                    now = time.perf_counter()
                    tok_s = window_tokens * self.dist.world_size / (now - window_start)
                    window_tokens, window_start = 0, now
                    bar.set_postfix(
                        loss=f"{stats['loss']:.3f}", lr=f"{stats['lr']:.2e}", tok_s=f"{tok_s:.0f}"
                    )
                    self.log({"step": self.step, "split": "train", **stats, "tokens_per_s": round(tok_s),
                              "epoch": self.task.epoch, "elapsed": round(self.elapsed, 1)})  # fmt: skip
                if self.step % cfg.eval_every == 0:
                    self.evaluate_and_save()
                    last_eval = self.step
                    if cfg.patience and self.bad_evals >= cfg.patience:
                        reason = "patience"
                        break
                if self._stop_signal:
                    reason = self._stop_signal
                    break
                if cfg.max_minutes and self.elapsed > 60 * cfg.max_minutes:
                    reason = "max_minutes"
                    break
            if self.step != last_eval:
                self.evaluate_and_save()
        finally:
            bar.close()
            for s, handler in old.items():
                signal.signal(s, handler)
            if self.tb is not None:
                self.tb.close()
        if self.dist.is_main:
            print(f"aiayn train: stopped at step {self.step} ({reason}); best checkpoint "
                  f"{(self.run_dir / 'best').resolve()}", file=sys.stderr)  # fmt: skip
        shutdown(self.dist)
        return {"step": self.step, "reason": reason, "best": self.best}
