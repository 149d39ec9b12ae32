"""Learning-rate schedules as pure functions of the update number (1-based).

noam (paper §5.3):  lr = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)
inverse_sqrt (fairseq): lr = peak · min(step / warmup, √(warmup / step))
constant:           lr = peak · min(1, step / warmup)
cosine (nanoGPT):   linear warm-up to peak, cosine decay to min_lr at decay_steps, then min_lr

A time-budgeted run (``horizon="budget"``, as in Cramming, Geiping & Goldstein 2023) moves the
cosine schedule by its *progress*: the larger of the fraction of steps done and the fraction of the
time budget spent, so the run ends annealed whichever runs out first, on any machine. The cosine
is then read at the effective step ``max(step, budget_used · decay_steps)``, warm-up included: the
schedule stays continuous and always ends at ``min_lr``, but a ``decay_steps`` far beyond what the
budget reaches ends the warm-up early in real updates, so set ``max_steps`` near that number.

A schedule's whole state is the step number and, for a budget, the training time spent (saved in
each checkpoint), so resuming needs nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("noam", "inverse_sqrt", "constant", "cosine")


@dataclass(frozen=True)
class Schedule:
    kind: str = "noam"
    peak: float = 1.0  # noam: the scale factor; others: the peak learning rate
    warmup: int = 4000
    d_model: int = 512  # noam only
    min_lr: float = 0.0  # cosine only
    decay_steps: int = 0  # cosine only: the step at which lr reaches min_lr

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule={self.kind!r} is not one of {SCHEDULES}")
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup} must be ≥ 0")

    def __call__(self, step: int, budget_used: float = 0.0) -> float:
        """The learning rate of update ``step``; ``budget_used`` ∈ [0, 1] is the fraction of a time
        budget spent (cosine only: 0 is a schedule by steps alone)."""
        step = max(step, 1)
        w = max(self.warmup, 1)
        if self.kind == "noam":
            return self.peak * self.d_model**-0.5 * min(step**-0.5, step * w**-1.5)
        if self.kind == "inverse_sqrt":
            return self.peak * min(step / w, math.sqrt(w / step))
        if self.kind == "constant":
            return self.peak * min(1.0, step / w)
        # cosine, at the effective step of a time budget
        step = max(step, min(max(budget_used, 0.0), 1.0) * self.decay_steps)
        if step < self.warmup:
            return self.peak * step / w
        if step >= self.decay_steps:
            return self.min_lr
        progress = (step - self.warmup) / max(self.decay_steps - self.warmup, 1)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.peak - self.min_lr)
