"""The optimiser and the learning-rate schedule a run steps with, built from its ``TrainConfig``.

Adam (paper §5.3) or AdamW, with weight decay on matrices only; the schedule is
``aiayn.training.schedule.Schedule``, whose cosine ends at ``decay_steps`` or, unset, ``max_steps``.
A task may scale the learning rate per parameter (``Task.lr_scale``, e.g. layer-wise decay when
fine-tuning): each group keeps its ``lr_scale`` and the loop sets ``lr = schedule × lr_scale``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from aiayn.training.config import TrainConfig
from aiayn.training.schedule import Schedule

_TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def make_optimizer(
    model: nn.Module, cfg: TrainConfig, lr_scale: Callable[[str], float] | None = None
) -> torch.optim.Optimizer:
    """Adam(β1, β2, ε) as in the paper; weight decay only on matrices (not biases, norms); a group
    per (learning-rate scale, decay) pair, the scale ``lr_scale(parameter name)`` (1 without it)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    groups: dict[tuple[float, bool], dict] = {}
    for name, p in named:
        scale = lr_scale(name) if lr_scale is not None else 1.0
        for decay in (True, False):  # matrices' group first, as before scales existed
            rate = cfg.weight_decay if decay else 0.0
            groups.setdefault((scale, decay), {"params": [], "lr_scale": scale, "weight_decay": rate})
        groups[scale, p.dim() >= 2]["params"].append(p)
    groups = [g for g in groups.values() if g["params"]]
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    # the fused kernel: one pass per tensor instead of a dozen elementwise ops (CUDA; CPU from torch 2.4)
    devices = ("cpu", "cuda") if _TORCH_VERSION >= (2, 4) else ("cuda",)
    fused = all(p.device.type in devices and p.is_floating_point() for p in params)
    return cls(groups, lr=0.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, fused=fused or None)


def make_schedule(cfg: TrainConfig, d_model: int) -> Schedule:
    """The learning rate of each update (``cfg.schedule``; ``d_model`` scales noam's)."""
    return Schedule(cfg.schedule, cfg.lr, cfg.warmup, d_model, cfg.min_lr, cfg.decay_steps or cfg.max_steps)
