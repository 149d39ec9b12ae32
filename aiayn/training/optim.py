"""The optimiser and the learning-rate schedule a run steps with, built from its ``TrainConfig``.

Adam (paper §5.3) or AdamW, with weight decay on matrices only; the schedule is
``aiayn.training.schedule.Schedule``, whose cosine ends at ``decay_steps`` or, unset, ``max_steps``.
"""

from __future__ import annotations

import torch
from torch import nn

from aiayn.training.config import TrainConfig
from aiayn.training.schedule import Schedule

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
    """The learning rate of each update (``cfg.schedule``; ``d_model`` scales noam's)."""
    return Schedule(cfg.schedule, cfg.lr, cfg.warmup, d_model, cfg.min_lr, cfg.decay_steps or cfg.max_steps)
