"""The training loop shared by every task: accumulate, clip, step, log, evaluate, checkpoint.

One ``Trainer`` per process. Under ``torchrun`` each rank trains on its shard of every epoch
(DistributedDataParallel averages gradients); only rank 0 evaluates and writes files.

The loss of an update is the sum over its target tokens divided by the number of target tokens
in the whole update (all micro-batches, all ranks), so accumulation and data parallelism give the
same gradient as one big batch.

The policies the loop calls live beside it: ``rundir`` (what ``out_dir`` holds, resume
compatibility), ``precision`` (autocast, ``precision="auto"``), ``optim`` (optimiser, schedule) and
``budget`` (what a time budget holds, ``short_budget``).
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from aiayn.data.files import checked_files
from aiayn.device import resolve_device
from aiayn.errors import AiaynError, ConfigError, ModelDirError
from aiayn.models.common import count_parameters
from aiayn.training import checkpoint as ckpt
from aiayn.training import rundir
from aiayn.training.budget import BudgetWatch, ShortBudget, budget_used
from aiayn.training.config import TrainConfig
from aiayn.training.distributed import (
    all_gather,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    disagreement,
    init_distributed,
    shutdown,
)
from aiayn.training.optim import make_optimizer, make_schedule
from aiayn.training.precision import autocast, resolve_precision
from aiayn.training.rundir import METRICS, plan_run_dir, prepare_run_dir, truncate_metrics
from aiayn.training.task import Batch, get_task

# why a run stops before max_steps, by priority: when ranks differ, the highest code wins
STOP_REASONS = ("", "max_epochs", "max_minutes", "patience", "SIGINT", "SIGTERM")


class TrainingDiverged(AiaynError):
    """The loss became NaN or infinite; the message names the last good checkpoint."""


def tensorboard_writer() -> type:
    """``SummaryWriter``, looked up before the run writes anything (``tensorboard=true``)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "tensorboard=true needs the tensorboard package: pip install tensorboard (or tensorboard=false)"
        ) from None
    return SummaryWriter


class Trainer:
    """One run of ``cfg`` in this process: ``Trainer(cfg, resume)`` claims ``cfg.out_dir`` and builds
    (or restores) the model, optimiser and data position; ``fit()`` trains until a stop reason."""

    def __init__(self, cfg: TrainConfig, resume: bool = False):
        self.cfg, self.run_dir = cfg, Path(cfg.out_dir)
        self.device = resolve_device(cfg.device)
        self.dist = init_distributed(self.device, cfg.device, cfg.ddp_timeout)
        if self.dist.enabled and self.device.type == "cuda":
            self.device = resolve_device(cfg.device, self.dist.local_rank)
            torch.cuda.set_device(self.device)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if cfg.precision != "auto":
            autocast(self.device, cfg.precision)  # fail early on an impossible precision
        self.tensorboard = tensorboard_writer() if cfg.tensorboard else None  # every rank: all fail alike
        self.lock = rundir.claim_run_dir(self.run_dir, cfg.out_dir, self.dist, self.device)  # until fit ends
        try:
            self.run_id, checkpoints, restart = plan_run_dir(self.run_dir, cfg, resume)
            barrier(self.dist)  # every rank looks before rank 0 writes
            if self.dist.is_main:
                prepare_run_dir(self.run_dir, cfg, self.run_id, restart)
            barrier(self.dist)
            self._setup(checkpoints)
        except BaseException:
            if self.lock is not None:  # a run that never started leaves nothing
                self.lock.remove_made()
            self.release()
            raise

    def release(self) -> None:
        """Free ``out_dir`` for another run (at the end of ``fit``; the OS frees it if we die)."""
        if self.lock is not None:
            self.lock.release()

    def _setup(self, checkpoints: list[Path]) -> None:
        """The task, model, precision, optimiser and schedule; the newest loadable checkpoint's state."""
        cfg = self.cfg
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        with checked_files() as files:  # the data files the task reads, which a checkpoint records
            self.task = get_task(cfg.task)(cfg, self.run_dir, self.dist)
        self.data_files = [[str(f.path), f.sha256] for f in files]
        self.model = self.task.build_model().to(self.device)
        self.precision = cfg.precision  # "auto" is decided after a resume, which keeps the run's choice
        self.optimizer = make_optimizer(self.model, cfg, self.task.lr_scale(self.model))
        self.schedule = make_schedule(cfg, self.model.config.d_model)
        self.scaler = torch.amp.GradScaler("cuda", enabled=cfg.precision == "fp16")  # "auto" is never fp16
        self.step, self.best, self.bad_evals, self.elapsed, self.evaluated = 0, None, 0, 0.0, True
        self.best_step: int | None = None  # the checkpoint that scored self.best
        self.short_budget = ShortBudget(cfg.max_tokens)  # the batches' size, which short_budget may halve
        torch.manual_seed(cfg.seed + 1000 * self.dist.rank)  # dropout masks differ per rank
        if checkpoints:
            self._resume(checkpoints)
        self.precision = resolve_precision(cfg.precision, self.device, self.dist, self.task.batch_tokens(),
                                           self.model.config, kept=self.precision)  # fmt: skip
        self.train_model = self.task.objective(self.model)  # the model and its loss, which the wrappers wrap
        if cfg.compile:
            self.train_model = torch.compile(self.train_model)
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            unused = not self.task.reads_every_parameter(self.model)  # BERT's head in a classifier
            self.train_model = DistributedDataParallel(
                self.train_model, device_ids=ids, find_unused_parameters=unused
            )
        self._stop_signal: str | None = None
        self.tb = None
        if self.dist.is_main:  # after a resume, the lines logged past the checkpoint are redone
            truncate_metrics(self.run_dir, self.step)

    @property
    def max_tokens(self) -> int:
        """The training batches' size now: ``cfg.max_tokens``, or half of it once short_budget halved it."""
        return self.short_budget.max_tokens

    @property
    def checked_rate(self) -> float | None:
        """Updates/s in batches of ``cfg.max_tokens`` when short_budget looked, or None."""
        return self.short_budget.checked_rate

    def _resume(self, checkpoints: list[Path]) -> None:
        """Continue from the newest checkpoint that loads, newest first; one that does not (a
        truncated file, another run's) is skipped with a warning naming it and why."""
        skipped: list[tuple[Path, str]] = []
        for path in checkpoints:
            try:
                rundir.check_resumed_data(self.run_dir, path, self.task.model_meta(), self.data_files)
                state = ckpt.load_checkpoint(path, self.model, self.optimizer, self.dist.rank, self.device)
                if state.get("run_id", self.run_id) != self.run_id:
                    raise ModelDirError(f"{path} belongs to another run (run_id {state['run_id']})")
                rundir.check_resumed_tokenizers(self.run_dir, path, self.task.save_tokenizers)
                break
            except ModelDirError as e:
                skipped.append((path, str(e)))
                rank = f" (rank {self.dist.rank})" if self.dist.enabled else ""
                print(f"aiayn train: warning{rank}: skipping checkpoint {path.name}: {e}", file=sys.stderr)
        else:
            why = "; ".join(e for _, e in skipped)
            raise ModelDirError(f"cannot resume {self.run_dir}: no checkpoint loads ({why})")
        steps = disagreement(state["step"], self.dist, self.device)  # ranks on other steps would not meet
        if steps is not None:
            raise ModelDirError(f"cannot resume {self.run_dir}: the ranks loaded different checkpoints "
                                f"(steps {steps}, by rank; the warnings above say why): mend or remove "
                                "the newer one")  # fmt: skip
        # each rank trains on its shard of the data: other shards would repeat and skip examples
        world, now = state.get("world_size", self.dist.world_size), self.dist.world_size  # older: as now
        if world != now:
            raise ConfigError(
                f"cannot resume {self.run_dir}: {path.name} was trained by {world} process(es), not {now}; "
                f"resume with --nproc_per_node={world} (torchrun)"
            )
        self.step, self.best, self.bad_evals = state["step"], state["best"], state["bad_evals"]
        self.best_step = state.get("best_step")  # older checkpoints: unknown
        self.elapsed, self.evaluated = state["elapsed"], state.get("evaluated", True)
        self.precision = state.get("precision", self.precision)  # what "auto" chose (older: "auto")
        if self.short_budget.load_state_dict(state):  # short_budget halved them
            self.task.rebatch(self.max_tokens)
        self.task.sampler.load_state_dict(state["sampler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if not state["rank_rng"]:  # a checkpoint without this rank's random state (older, or fewer ranks)
            torch.manual_seed(self.cfg.seed + 1000 * self.dist.rank + self.step)
        if self.dist.is_main:  # newer ones that did not load set aside; best where the state says
            ckpt.after_resume(
                self.run_dir, path, [p for p, _ in skipped], state.get("is_best", False), self.best_step
            )
            print(f"aiayn train: resuming {self.run_dir} from {path.name}", file=sys.stderr)

    # -- bookkeeping ----------------------------------------------------------------------------
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
        cfg, objective = self.cfg, self.train_model
        objective.train()
        lr = self.schedule(self.step + 1, budget_used(cfg, self.elapsed))
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        batches = [b.to(self.device, non_blocking=True) for b in batches]
        n_tokens = sum(self.task.n_targets(b) for b in batches)
        total = all_reduce_sum(torch.tensor(float(n_tokens), device=self.device), self.dist).item()
        scale = self.dist.world_size / total  # DDP averages over ranks
        loss_sum = nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            sync = i == len(batches) - 1 or not self.dist.enabled
            no_sync = contextlib.nullcontext() if sync else objective.no_sync()
            with no_sync, autocast(self.device, self.precision):
                loss, nll, _ = objective(batch, cfg.label_smoothing)
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
                f"{ckpt.latest_checkpoint(self.run_dir) or 'none'}; --resume would diverge again there: "
                f"start a new run in another out_dir with a lower lr, or clip_norm > 0"
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
            self.best, self.best_step, self.bad_evals = score, self.step, 0
            return True
        self.bad_evals += 1
        return False

    def save(self, improved: bool) -> Path | None:
        """Rank 0 writes the checkpoint, with every rank's random state (gathered: each rank's dropout
        masks continue on resume as they would have, so a resumed torchrun run is bit-exact too)."""
        rank_rngs = all_gather(ckpt.rank_rng_state(self.device), self.dist, self.device)
        if not self.dist.is_main:
            return None
        state = {"best": self.best, "best_step": self.best_step, "bad_evals": self.bad_evals,
                 "elapsed": self.elapsed,
                 "sampler": self.task.sampler.state_dict(), "scaler": self.scaler.state_dict() or None,
                 "epoch": self.task.epoch, "run_id": self.run_id, "world_size": self.dist.world_size,
                 "data_files": self.data_files, "evaluated": self.evaluated, "precision": self.precision,
                 "is_best": improved,
                 **self.short_budget.state_dict()}  # fmt: skip
        path = ckpt.save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, state,
                                    self.task.save_tokenizers, self.task.model_meta(),
                                    rank_rngs if self.dist.enabled else None)  # fmt: skip
        if improved or not (self.run_dir / "best").exists():
            ckpt.mark_best(self.run_dir, path)
        ckpt.prune(self.run_dir, self.cfg.keep_last)
        return path

    def evaluate_and_save(self, evaluate: bool = True) -> dict[str, float]:
        self.evaluated, evaluate = evaluate, evaluate and self.dist.is_main  # a resumed run evaluates if not
        metrics = self.evaluate() if evaluate else {}
        improved = self._improved(metrics) if evaluate else False
        if evaluate:
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

    # -- the loop -------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train to ``max_steps`` or the first of ``STOP_REASONS``, evaluating and saving every
        ``eval_every`` updates and at the end; signals stop the run cleanly, with a checkpoint."""
        cfg = self.cfg
        if self.tensorboard is not None and self.dist.is_main:
            # a resumed run drops the events logged after its checkpoint, as metrics.jsonl does
            purge = self.step + 1 if self.step else None
            self.tb = self.tensorboard(str(self.run_dir / "tensorboard"), purge_step=purge)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        if self.dist.is_main:
            n = count_parameters(self.model)
            print(f"aiayn train: {n / 1e6:.2f}M parameters, device {self.device}, "
                  f"{self.dist.world_size} process(es), run {self.run_dir}", file=sys.stderr)  # fmt: skip
        bar = tqdm(total=cfg.max_steps, initial=self.step, disable=not (cfg.progress and self.dist.is_main),
                   dynamic_ncols=True, desc="train")  # fmt: skip
        try:
            reason = self._train(bar)
        finally:
            bar.close()
            for s, handler in old.items():
                signal.signal(s, handler)
            if self.tb is not None:
                self.tb.close()
            self.release()
        if self.dist.is_main:
            print(f"aiayn train: stopped at step {self.step} ({reason}); best checkpoint "
                  f"{(self.run_dir / 'best').resolve()}", file=sys.stderr)  # fmt: skip
        shutdown(self.dist)
        return {"step": self.step, "reason": reason, "best": self.best, "max_tokens": self.max_tokens}

    def _train(self, bar: tqdm) -> str:
        """The updates, then the last evaluation; returns why they stopped."""
        cfg, reason, last_eval = self.cfg, "max_steps", self.step if self.evaluated else -1
        batches = self.task.train_batches()
        window_tokens, window_start = 0, time.perf_counter()  # for tokens/s between log lines
        budget = BudgetWatch(cfg, self.dist, self.device, self.short_budget, self.step, self.elapsed)
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
                self._log_train(stats, tok_s, bar)
                budget.follow(bar, self.step, self.elapsed)
            if budget.after_update(self.step, self.elapsed, self.task.rebatch):  # short_budget halved them
                batches = self.task.train_batches()  # the current epoch again, in the new batches
            if self.step % cfg.eval_every == 0:
                self.evaluate_and_save()
                last_eval = self.step
                window_tokens, window_start = 0, time.perf_counter()  # tokens/s counts updates only
        if reason == "max_steps" and (stop := self.agree_to_stop()) in ("SIGINT", "SIGTERM"):
            reason = stop  # received during the last update: no evaluation in a grace period
        if reason == "max_minutes":  # the budget's estimate of the total becomes the count
            bar.total = self.step
            bar.refresh()
        if self.step != last_eval:  # after a signal saved now, not evaluated (a grace period is short;
            self.evaluate_and_save(reason not in ("SIGINT", "SIGTERM"))  # resumed, it evaluates as it would)
        return reason

    def _log_train(self, stats: dict[str, float], tok_s: float, bar: tqdm) -> None:
        bar.set_postfix(loss=f"{stats['loss']:.3f}", lr=f"{stats['lr']:.2e}", tok_s=f"{tok_s:.0f}")
        self.log({"step": self.step, "split": "train", **stats, **self.task.pop_metrics("train"),
                  "tokens_per_s": round(tok_s), "epoch": self.task.epoch,
                  "elapsed": round(self.elapsed, 1), "max_tokens": self.max_tokens})  # fmt: skip
