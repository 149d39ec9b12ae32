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
import uuid
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from aiayn.atomic import remove_temporaries, write_json, write_text
from aiayn.device import resolve_device
from aiayn.errors import AiaynError, ConfigError, ModelDirError, OutputError
from aiayn.models.common import count_parameters
from aiayn.textfiles import read_json
from aiayn.training import checkpoint as ckpt
from aiayn.training.config import TrainConfig, to_dict
from aiayn.training.distributed import (
    all_reduce_max,
    all_reduce_sum,
    barrier,
    init_distributed,
    shutdown,
)
from aiayn.training.schedule import Schedule
from aiayn.training.task import TOKENIZER_DIR, Batch, get_task

TRAIN_CONFIG = "train_config.json"
METRICS = "metrics.jsonl"
# fields that may change when a run is resumed: they do not change what is computed
# (short_budget acts once, at update SPEED_UPDATES; a run past it keeps what it decided, which its checkpoints
# hold, so a run started before the field existed resumes under a recipe that sets it)
RESUMABLE_CHANGES = {"max_steps", "max_epochs", "max_minutes", "patience", "eval_every", "log_every",
                     "keep_last", "progress", "device", "threads", "tensorboard", "eval_max_sentences",
                     "compile", "out_dir", "short_budget"}  # fmt: skip
# why a run stops before max_steps, by priority: when ranks differ, the highest code wins
STOP_REASONS = ("", "max_epochs", "max_minutes", "patience", "SIGINT", "SIGTERM")
# what a run that never reached a checkpoint leaves; removed when it is started again
RUN_FILES = (TRAIN_CONFIG, METRICS, TOKENIZER_DIR, "tensorboard")
# a time-budgeted run says its speed after SPEED_UPDATES updates, and short_budget acts at update
# SPEED_UPDATES on the speed of the updates after the first SPEED_SKIP (compiling, first allocations)
SPEED_UPDATES, SPEED_SKIP = 20, 5


class TrainingDiverged(AiaynError):
    """The loss became NaN or infinite; the message names the last good checkpoint."""


_TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam(β1, β2, ε) as in the paper; weight decay only on matrices (not biases, norms)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    # the fused kernel: one pass per tensor instead of a dozen elementwise ops (CUDA; CPU from torch 2.4)
    devices = ("cpu", "cuda") if _TORCH_VERSION >= (2, 4) else ("cuda",)
    fused = all(p.device.type in devices and p.is_floating_point() for p in params)
    return cls(groups, lr=0.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, fused=fused or None)


def make_schedule(cfg: TrainConfig, d_model: int) -> Schedule:
    return Schedule(cfg.schedule, cfg.lr, cfg.warmup, d_model, cfg.min_lr, cfg.decay_steps or cfg.max_steps)


# precision="auto" trains in bf16 where a bfloat16 matrix product of the model's feed-forward size
# runs at least this many times faster than a float32 one (CPUs with AVX512_BF16 or AMX, CUDA GPUs
# with bfloat16); elsewhere bfloat16 is emulated and slower, and fp32 is kept.
AUTO_BF16_MIN_SPEEDUP = 1.25


def bf16_speedup(device: torch.device, tokens: int, d_model: int, d_ff: int) -> float:
    """float32 time / bfloat16 time of a (tokens × d_model) · (d_model × d_ff) product on this
    device now, each the best of 5 (≈ 0.1 s in all on a CPU)."""

    def best(dtype: torch.dtype) -> float:
        x = torch.randn(tokens, d_model, device=device, dtype=dtype)
        w = torch.randn(d_ff, d_model, device=device, dtype=dtype)
        times = []
        for _ in range(6):  # the first call warms up and is not counted
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            nn.functional.linear(x, w)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    return best(torch.float32) / best(torch.bfloat16)


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("precision=fp16 needs a CUDA device; use bf16 on CPU")
    return torch.autocast(device.type, dtype=dtype)


def read_run_config(run_dir: Path) -> dict:
    """The ``train_config.json`` of a run (its ``TrainConfig`` fields and ``run_id``)."""
    return read_json(run_dir / TRAIN_CONFIG, f"{run_dir} is not a training run", fix="resume cannot go on")


def check_resume_compatible(saved: dict, cfg: TrainConfig, run_dir: Path) -> None:
    """Only the fields in ``RESUMABLE_CHANGES`` may differ from the run's: the others change what
    is computed. The run is known by its ``run_id``, not its path, so a moved run resumes."""
    now, default = to_dict(cfg), to_dict(TrainConfig())  # a field added since the run: its default
    changed = sorted(k for k in now if k not in RESUMABLE_CHANGES and saved.get(k, default[k]) != now[k])
    if changed:
        k = changed[0]
        raise ConfigError(
            f"cannot resume {run_dir}: {k} was {saved.get(k, default[k])!r}, now {now[k]!r} "
            f"({len(changed)} incompatible field(s): {', '.join(changed)}); resume with the run's "
            f"settings (its {TRAIN_CONFIG}), or start a new run in another out_dir"
        )


def plan_run_dir(run_dir: Path, cfg: TrainConfig, resume: bool) -> tuple[str, list[Path], bool]:
    """What ``out_dir`` holds and what to do with it: ``(run_id, checkpoints newest first, restart)``.

    A run with checkpoints continues only with ``--resume`` and compatible settings; a run that
    stopped before its first checkpoint is started again (``restart``: its files are ours to
    replace); anything else that is not empty is not ours, and is never written into.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise OutputError(f"out_dir={cfg.out_dir!r} is a file; choose a directory for the run")
    checkpoints = [p for _, p in reversed(ckpt.step_dirs(run_dir))]
    saved_models = any(run_dir.glob("step-*")) or (run_dir / "best").is_symlink()
    if saved_models and not resume:
        raise OutputError(f"{run_dir} already holds a run: pass --resume, or choose another out_dir")
    if checkpoints:
        saved = read_run_config(run_dir)
        check_resume_compatible(saved, cfg, run_dir)
        return str(saved.get("run_id") or uuid.uuid4().hex), checkpoints, False  # a run from before ids: new
    if saved_models:
        raise OutputError(f"{run_dir} holds models but no trainer state to resume; choose another out_dir")
    if (run_dir / TRAIN_CONFIG).is_file():
        return uuid.uuid4().hex, [], True
    if resume:
        raise ModelDirError(f"cannot resume: {run_dir / TRAIN_CONFIG} is missing ({run_dir} holds no run)")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise OutputError(f"out_dir={cfg.out_dir!r} is not empty and holds no run; choose a new directory")
    return uuid.uuid4().hex, [], False


def _record(line: str) -> dict | None:
    """A metrics line as a dict, or None for a torn or foreign one (a run killed mid-write)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step", 0), int) else None


def budget_too_short(cfg: TrainConfig, max_tokens: int, reachable: int) -> bool:
    """Whether a time-budgeted translation run of ``max_tokens``-token batches, whose budget holds
    ``reachable`` updates at the speed measured, should train on with half-size updates.

    A recipe's ``max_steps`` is a cap near what the machines it was tuned on reach; on a machine far
    slower, where the budget holds under a third of it, the few updates of the recipe's size learn
    less than twice as many of half the size: de→en 38.40 against 23.69 BLEU, en→de 38.47 against
    35.72 (an AMD EPYC Zen 1 VM; at 44% of max_steps, on a faster VM, the halving was level on
    validation; docs/results.md, "Smaller updates on a slow machine"). Once: quarter-size updates at
    the same learning rate trained worse (the demo's loss climbed back; docs/results.md, "make
    demo"). Never below 512 tokens (untried), nor where half the batch would not hold a pair of
    ``max_len``.
    """
    if cfg.task != "translation" or reachable >= cfg.max_steps / 3:
        return False
    return max_tokens > 1024 and max_tokens // 2 > cfg.max_len


def slow_machine_hint(cfg: TrainConfig, reachable: int) -> str | None:
    """With ``short_budget="warn"``: the advice for a run ``budget_too_short`` finds, or None."""
    if not budget_too_short(cfg, cfg.max_tokens, reachable):
        return None
    return (f"aiayn train: under a third of max_steps; on a machine this slow, smaller updates train further "
            f"within the budget (e.g. max_tokens={cfg.max_tokens // 2}, or short_budget=\"halve_max_tokens\" "
            "to switch by itself; docs/results.md)")  # fmt: skip


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
        if cfg.precision != "auto":
            autocast(self.device, cfg.precision)  # fail early on an impossible precision
        self.run_id, checkpoints, restart = plan_run_dir(self.run_dir, cfg, resume)
        fresh = not self.run_dir.exists()
        barrier(self.dist)  # every rank looks before rank 0 writes
        if self.dist.is_main:
            if restart:
                print(f"aiayn train: {self.run_dir} has no checkpoint: starting it again", file=sys.stderr)
                for name in RUN_FILES:
                    path = self.run_dir / name
                    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            remove_temporaries(self.run_dir)
            write_json(self.run_dir / TRAIN_CONFIG, {**to_dict(cfg), "run_id": self.run_id})
        barrier(self.dist)
        try:
            self._setup(checkpoints)
        except BaseException:
            if fresh and self.dist.is_main:  # a run that never started leaves nothing behind
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    def _setup(self, checkpoints: list[Path]) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.task = get_task(cfg.task)(cfg, self.run_dir, self.dist)
        self.model = self.task.build_model().to(self.device)
        self.precision = self._resolve_precision()
        self.optimizer = make_optimizer(self.model, cfg)
        self.schedule = make_schedule(cfg, self.model.config.d_model)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        self.step, self.best, self.bad_evals, self.elapsed = 0, None, 0, 0.0
        # the batches' size, which short_budget may halve once, when the speed is first measured
        self.max_tokens, self.speed_checked = cfg.max_tokens, False
        self.checked_rate: float | None = None  # updates/s of cfg.max_tokens when short_budget looked
        torch.manual_seed(cfg.seed + 1000 * self.dist.rank)  # dropout masks differ per rank
        if checkpoints:
            self._resume(checkpoints)
        self.train_model = self.model
        if cfg.compile:
            self.train_model = torch.compile(self.model)
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = DistributedDataParallel(self.train_model, device_ids=ids)
        self._stop_signal: str | None = None
        self.tb = None
        self._truncate_metrics()

    def _resolve_precision(self) -> str:
        """``cfg.precision``, with "auto" decided by rank 0's measurement (``bf16_speedup``) so that
        every rank trains alike."""
        if self.cfg.precision != "auto":
            return self.cfg.precision
        config = self.model.config
        speedup = torch.zeros((), device=self.device)
        if self.dist.is_main:
            speedup += bf16_speedup(self.device, self.cfg.max_tokens, config.d_model, config.d_ff)
        speedup = float(all_reduce_sum(speedup, self.dist))
        precision = "bf16" if speedup >= AUTO_BF16_MIN_SPEEDUP else "fp32"
        if self.dist.is_main:
            print(f"aiayn train: precision=auto chose {precision}: bfloat16 products ran "
                  f"{speedup:.2f}× as fast as float32 here (bf16 from {AUTO_BF16_MIN_SPEEDUP}×)",
                  file=sys.stderr)  # fmt: skip
        return precision

    def _resume(self, checkpoints: list[Path]) -> None:
        """Continue from the newest checkpoint that loads, newest first; one that does not (a
        truncated file, another run's) is skipped with a warning naming it and why."""
        skipped = []
        for path in checkpoints:
            try:
                state = ckpt.load_checkpoint(path, self.model, self.optimizer)  # restores rank 0's RNG
                if state.get("run_id", self.run_id) != self.run_id:
                    raise ModelDirError(f"{path} belongs to another run (run_id {state['run_id']})")
                break
            except ModelDirError as e:
                skipped.append(str(e))
                if self.dist.is_main:
                    print(f"aiayn train: warning: skipping checkpoint {path.name}: {e}", file=sys.stderr)
        else:
            raise ModelDirError(f"cannot resume {self.run_dir}: no checkpoint loads ({'; '.join(skipped)})")
        self.step, self.best, self.bad_evals = state["step"], state["best"], state["bad_evals"]
        self.elapsed = state["elapsed"]
        self.speed_checked = state.get("speed_checked", True)  # a run from before short_budget: checked
        if state.get("max_tokens", self.max_tokens) != self.max_tokens:  # short_budget halved them
            self.max_tokens = int(state["max_tokens"])
            self.task.rebatch(self.max_tokens)
        self.task.sampler.load_state_dict(state["sampler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.dist.rank:
            torch.manual_seed(self.cfg.seed + 1000 * self.dist.rank + self.step)
        if self.dist.is_main:
            print(f"aiayn train: resuming {self.run_dir} from {path.name}", file=sys.stderr)

    # -- bookkeeping ----------------------------------------------------------------------------
    def _truncate_metrics(self) -> None:
        """After a resume, drop metrics lines logged after the checkpoint (they will be redone)."""
        path = self.run_dir / METRICS
        if self.dist.is_main and path.exists():
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            kept = [ln for ln in lines if (r := _record(ln)) is not None and r.get("step", 0) <= self.step]
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
        lr = self.schedule(self.step + 1, self.budget_used())
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batches = [b.to(self.device, non_blocking=True) for b in batches]
        n_tokens = sum(self.task.n_targets(b) for b in batches)
        total = all_reduce_sum(torch.tensor(float(n_tokens), device=self.device), self.dist).item()
        scale = self.dist.world_size / total  # DDP averages over ranks
        loss_sum = nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            sync = i == len(batches) - 1 or not self.dist.enabled
            no_sync = contextlib.nullcontext() if sync else model.no_sync()
            with no_sync, autocast(self.device, self.precision):
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
        # the update's loss over all ranks: every rank sees the same value, so a non-finite loss
        # stops them all at the same step
        sums = all_reduce_sum(torch.stack([loss_sum, nll_sum]).float(), self.dist)
        loss_value, nll_value = float(sums[0]) / total, float(sums[1]) / total
        if not math.isfinite(loss_value):
            raise TrainingDiverged(
                f"loss is {loss_value} at step {self.step}; the last good checkpoint is "
                f"{ckpt.latest_checkpoint(self.run_dir) or 'none'} (try a lower lr or clip_norm)"
            )
        return {"loss": loss_value, "nll": nll_value, "lr": lr,
                "grad_norm": float(grad_norm), "tokens": n_tokens}  # fmt: skip

    # -- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        model = self.model
        model.eval()
        loss_sum = nll_sum = n = 0.0
        for batch in self.task.valid_batches():
            batch = batch.to(self.device)
            with autocast(self.device, self.precision):
                loss, nll, k = self.task.loss(model, batch, self.cfg.label_smoothing)
            loss_sum, nll_sum, n = loss_sum + float(loss), nll_sum + float(nll), n + int(k)
        out = {"loss": loss_sum / n, "nll": nll_sum / n, "ppl": math.exp(min(nll_sum / n, 50.0)),
               **self.task.pop_metrics("valid")}  # fmt: skip
        with autocast(self.device, self.precision):
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
                 "epoch": self.task.epoch, "run_id": self.run_id, "max_tokens": self.max_tokens,
                 "speed_checked": self.speed_checked}  # fmt: skip
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
        barrier(self.dist)
        return metrics

    def agree_to_stop(self) -> str:
        """Why the run must stop now ("" = go on), the same answer on every rank.

        Rank 0 alone judges the budget, the epochs and the patience (by its own clock and counts,
        which it also saves); a signal received by any rank stops them all. The codes are combined
        with an all-reduce (max), so no rank leaves the loop while another enters the next update
        and waits for it forever.
        """
        cfg, reasons = self.cfg, [self._stop_signal or ""]
        if self.dist.is_main:
            if cfg.max_epochs and self.task.epoch >= cfg.max_epochs:
                reasons.append("max_epochs")
            if cfg.max_minutes and self.elapsed > 60 * cfg.max_minutes:
                reasons.append("max_minutes")
            if cfg.patience and self.bad_evals >= cfg.patience:
                reasons.append("patience")
        code = max(STOP_REASONS.index(r) for r in reasons)
        if self.dist.enabled:  # every rank adopts rank 0's clock (the budget, the schedule)
            clock = self.elapsed if self.dist.is_main else 0.0
            agreed = torch.tensor([float(code), clock], dtype=torch.float64, device=self.device)
            agreed = all_reduce_max(agreed, self.dist)
            code, self.elapsed = int(agreed[0]), float(agreed[1])
        return STOP_REASONS[code]

    def budget_used(self) -> float:
        """The fraction of the time budget spent, for a schedule whose horizon is the budget."""
        return self.elapsed / (60 * self.cfg.max_minutes) if self.cfg.horizon == "budget" else 0.0

    def _reachable(self, since: tuple[int, float]) -> tuple[float, int] | None:
        """(updates/s of training time since ``since``, the updates the time budget allows at that
        speed), or None without a budget or a timed update."""
        steps, seconds = self.step - since[0], self.elapsed - since[1]
        if not (self.cfg.max_minutes and steps and seconds > 0):
            return None
        rate = steps / seconds
        return rate, self.step + int(rate * max(60 * self.cfg.max_minutes - self.elapsed, 0.0))

    def _follow_budget(self, bar: tqdm, start: tuple[int, float]) -> None:
        """Set the progress bar's total to the updates the time budget allows at the speed measured
        since ``start`` (so its ETA is the budget's), and say once what that speed is."""
        speed = self._reachable(start)
        if speed is None:
            return
        (rate, reachable), steps, left = speed, self.step - start[0], 60 * self.cfg.max_minutes - self.elapsed
        # while time is left, at least the updates until the next refresh: the bar never runs past its total
        floor = self.step + (self.cfg.log_every if left > 0 else 0)
        bar.total = min(self.cfg.max_steps, max(floor, reachable))
        bar.refresh()
        if steps >= SPEED_UPDATES and not self._told_speed and self.dist.is_main:
            self._told_speed = True
            budget, cap = f"{self.cfg.max_minutes:g}-minute", f"max_steps {self.cfg.max_steps:,}"
            size = f" of max_tokens={self.max_tokens}" if self.max_tokens != self.cfg.max_tokens else ""
            tqdm.write(f"aiayn train: {rate:.2f} updates/s{size} on this machine; the {budget} budget allows "
                       f"≈ {reachable:,} updates ({cap})", file=sys.stderr)  # fmt: skip
            hint = slow_machine_hint(self.cfg, reachable) if self.cfg.short_budget == "warn" else None
            if hint:
                tqdm.write(hint, file=sys.stderr)

    def _halve_batches(self, since: tuple[int, float]) -> bool:
        """``short_budget="halve_max_tokens"``: at update ``SPEED_UPDATES``, once per run, halve the
        batches if rank 0 finds the budget too short (``budget_too_short``) at the speed measured
        ``since`` then; every rank follows its answer. True when the batches changed."""
        cfg = self.cfg
        if cfg.short_budget != "halve_max_tokens" or self.speed_checked or self.step != SPEED_UPDATES:
            return False
        self.speed_checked = True
        speed = self._reachable(since)
        if speed is not None:
            self.checked_rate = speed[0]
        short = self.dist.is_main and speed is not None and budget_too_short(cfg, self.max_tokens, speed[1])
        if self.dist.enabled:  # rank 0's clock decides for every rank
            short = bool(all_reduce_max(torch.tensor([float(short)], device=self.device), self.dist)[0])
        if not short:
            return False
        self.max_tokens //= 2
        self.task.rebatch(self.max_tokens)
        if self.dist.is_main:
            (rate, reachable), timed = speed, f"updates {since[0] + 1}–{self.step}"
            tqdm.write(f"aiayn train: {rate:.2f} updates/s over {timed}: the budget holds ≈ {reachable:,}, "
                       f"under a third of max_steps; on with max_tokens={self.max_tokens} "
                       "(short_budget=\"halve_max_tokens\"), whose smaller updates train further on a "
                       "machine this slow (docs/results.md)", file=sys.stderr)  # fmt: skip
        return True

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
        start, self._told_speed = (self.step, self.elapsed), False
        speed_from = start  # where short_budget times the updates from: past the first SPEED_SKIP
        try:
            while self.step < cfg.max_steps:
                if stop := self.agree_to_stop():
                    reason = stop
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
                    self.log({"step": self.step, "split": "train", **stats, **self.task.pop_metrics("train"),
                              "tokens_per_s": round(tok_s), "epoch": self.task.epoch,
                              "elapsed": round(self.elapsed, 1), "max_tokens": self.max_tokens})  # fmt: skip
                    self._follow_budget(bar, start)
                if self.step == SPEED_SKIP and start[0] < SPEED_SKIP:
                    speed_from = (self.step, self.elapsed)
                if self._halve_batches(speed_from):
                    batches = self.task.train_batches()  # the current epoch again, in the new batches
                    start, self._told_speed = (self.step, self.elapsed), False  # time the new size
                if self.step % cfg.eval_every == 0:
                    self.evaluate_and_save()
                    last_eval = self.step
            if reason == "max_minutes":  # the budget's estimate of the total becomes the count
                bar.total = self.step
                bar.refresh()
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
        return {"step": self.step, "reason": reason, "best": self.best, "max_tokens": self.max_tokens}
