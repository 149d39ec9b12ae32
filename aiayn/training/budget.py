"""Time-budget policies of a run with ``max_minutes``: what the budget holds, and ``short_budget``.

A run timed by a budget measures its speed (updates per second of training time) and from it the
updates the budget holds. That number sets the progress bar's total (so its ETA is the budget's),
is said once, and, with ``TrainConfig.short_budget``, decides once whether the run goes on in
half-size batches: a recipe's ``max_steps`` is a cap near what the machines it was tuned on reach,
and where the budget holds far fewer of its updates, twice as many updates of half the size learn
more (docs/results.md, "Smaller updates on a slow machine").

``ShortBudget`` is the decision's state, saved in every checkpoint so that ``--resume`` is exact on
either side of it; ``BudgetWatch`` is one ``fit``'s bookkeeping. Under ``torchrun`` rank 0's clock
decides for every rank.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm import tqdm

from aiayn.training.config import TrainConfig
from aiayn.training.distributed import DistInfo, all_reduce_max
from aiayn.training.task import get_task

# a time-budgeted run says its speed after SPEED_UPDATES updates, and short_budget acts at update
# SPEED_UPDATES on the speed of the updates after the first SPEED_SKIP (compiling, first allocations)
SPEED_UPDATES, SPEED_SKIP = 20, 5

Since = tuple[int, float]  # (update, training seconds) a speed is measured from


def budget_used(cfg: TrainConfig, elapsed: float) -> float:
    """The fraction of the time budget spent, for a schedule whose horizon is the budget (else 0)."""
    return elapsed / (60 * cfg.max_minutes) if cfg.horizon == "budget" else 0.0


def reachable_updates(cfg: TrainConfig, step: int, elapsed: float, since: Since) -> tuple[float, int] | None:
    """(updates/s of training time since ``since``, the updates the time budget allows at that
    speed), or None without a budget or a timed update."""
    steps, seconds = step - since[0], elapsed - since[1]
    if not (cfg.max_minutes and steps and seconds > 0):
        return None
    rate = steps / seconds
    return rate, step + int(rate * max(60 * cfg.max_minutes - elapsed, 0.0))


def budget_too_short(cfg: TrainConfig, max_tokens: int, reachable: int) -> bool:
    """Whether a time-budgeted run of ``max_tokens``-token batches (a task that can ``rebatch``: the
    measurements are translation's), whose budget holds
    ``reachable`` updates at the speed measured, should train on with half-size updates.

    Where the budget holds under a third of ``max_steps``, the few updates of the recipe's size
    learn less than twice as many of half the size; where it holds more, halving was level, so the
    recipe's size is kept. Once only: quarter-size updates at the same learning rate trained worse.
    Never below 512 tokens (untried), nor where half the batch would not hold a pair of
    ``max_len``. The measurements are in docs/results.md ("Smaller updates on a slow machine",
    "make demo").
    """
    if not get_task(cfg.task).token_batches or reachable >= cfg.max_steps / 3:
        return False
    return max_tokens > 1024 and max_tokens // 2 > cfg.max_len


def slow_machine_hint(cfg: TrainConfig, reachable: int) -> str | None:
    """With ``short_budget="warn"``: the advice for a run ``budget_too_short`` finds, or None."""
    if not budget_too_short(cfg, cfg.max_tokens, reachable):
        return None
    return (f"aiayn train: under a third of max_steps; on a machine this slow, smaller updates train further "
            f"within the budget (e.g. max_tokens={cfg.max_tokens // 2}, or short_budget=\"halve_max_tokens\" "
            "to switch by itself; docs/results.md)")  # fmt: skip


@dataclass
class ShortBudget:
    """The batches' size, which ``short_budget`` may halve once, when the speed is first measured.

    ``max_tokens`` and ``speed_checked`` are saved in every checkpoint (``state_dict``);
    ``checked_rate`` is what the run measured then, for the caller to report.
    """

    max_tokens: int
    speed_checked: bool = False  # short_budget has looked (it looks once per run)
    checked_rate: float | None = None  # updates/s of cfg.max_tokens when short_budget looked

    def state_dict(self) -> dict:
        return {"max_tokens": self.max_tokens, "speed_checked": self.speed_checked}

    def load_state_dict(self, state: dict) -> bool:
        """Restore the decision from a checkpoint's trainer state; True when the size changed (the
        task must rebatch). A run from before short_budget saved neither: it has looked, and keeps
        its size."""
        self.speed_checked = state.get("speed_checked", True)
        if state.get("max_tokens", self.max_tokens) == self.max_tokens:
            return False
        self.max_tokens = int(state["max_tokens"])
        return True


class BudgetWatch:
    """One ``fit``'s bookkeeping of the budget: the speed since ``start`` (where this process began
    training, or the batches last changed size), and the updates ``short_budget`` times, which
    begin after the first ``SPEED_SKIP``."""

    def __init__(self, cfg: TrainConfig, dist: DistInfo, device: torch.device, state: ShortBudget,
                 step: int, elapsed: float) -> None:  # fmt: skip
        self.cfg, self.dist, self.device, self.state = cfg, dist, device, state
        self.start: Since = (step, elapsed)
        self.speed_from: Since = self.start
        self.told_speed = False

    def follow(self, bar: tqdm, step: int, elapsed: float) -> None:
        """Set the progress bar's total to the updates the time budget allows at the speed measured
        since ``start`` (so its ETA is the budget's), and say once what that speed is."""
        cfg = self.cfg
        speed = reachable_updates(cfg, step, elapsed, self.start)
        if speed is None:
            return
        (rate, held), steps, left = speed, step - self.start[0], 60 * cfg.max_minutes - elapsed
        # while time is left, at least the updates until the next refresh: the bar never runs past its total
        floor = step + (cfg.log_every if left > 0 else 0)
        bar.total = min(cfg.max_steps, max(floor, held))
        bar.refresh()
        if steps >= SPEED_UPDATES and not self.told_speed and self.dist.is_main:
            self.told_speed = True
            budget, cap = f"{cfg.max_minutes:g}-minute", f"max_steps {cfg.max_steps:,}"
            max_tokens = self.state.max_tokens
            size = f" of max_tokens={max_tokens}" if max_tokens != cfg.max_tokens else ""
            tqdm.write(f"aiayn train: {rate:.2f} updates/s{size} on this machine; the {budget} budget allows "
                       f"≈ {held:,} updates ({cap})", file=sys.stderr)  # fmt: skip
            hint = slow_machine_hint(cfg, held) if cfg.short_budget == "warn" else None
            if hint:
                tqdm.write(hint, file=sys.stderr)

    def after_update(self, step: int, elapsed: float, rebatch: Callable[[int], None]) -> bool:
        """Called after every update: starts short_budget's timing past ``SPEED_SKIP``, and halves
        the batches when it decides to (``rebatch(max_tokens)``). True when the batches changed:
        the speed is then timed anew, in the new size."""
        if step == SPEED_SKIP and self.start[0] < SPEED_SKIP:
            self.speed_from = (step, elapsed)
        if not self._halve_batches(step, elapsed, rebatch):
            return False
        self.start, self.told_speed = (step, elapsed), False
        return True

    def _halve_batches(self, step: int, elapsed: float, rebatch: Callable[[int], None]) -> bool:
        """``short_budget="halve_max_tokens"``: at update ``SPEED_UPDATES``, once per run, halve the
        batches if rank 0 finds the budget too short (``budget_too_short``) at the speed measured
        since ``speed_from``; every rank follows its answer. True when the batches changed."""
        cfg, state, since = self.cfg, self.state, self.speed_from
        if cfg.short_budget != "halve_max_tokens" or state.speed_checked or step != SPEED_UPDATES:
            return False
        state.speed_checked = True
        speed = reachable_updates(cfg, step, elapsed, since)
        if speed is not None:
            state.checked_rate = speed[0]
        short = self.dist.is_main and speed is not None and budget_too_short(cfg, state.max_tokens, speed[1])
        if self.dist.enabled:  # rank 0's clock decides for every rank
            short = bool(all_reduce_max(torch.tensor([float(short)], device=self.device), self.dist)[0])
        if not short:
            return False
        state.max_tokens //= 2
        rebatch(state.max_tokens)
        if self.dist.is_main:
            (rate, held), timed = speed, f"updates {since[0] + 1}–{step}"
            tqdm.write(f"aiayn train: {rate:.2f} updates/s over {timed}: the budget holds ≈ {held:,}, "
                       f"under a third of max_steps; on with max_tokens={state.max_tokens} "
                       "(short_budget=\"halve_max_tokens\"), whose smaller updates train further on a "
                       "machine this slow (docs/results.md)", file=sys.stderr)  # fmt: skip
        return True
