"""Position-wise feed-forward network (paper §3.3).

FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to each position separately and identically.
GELU (GPT-2, BERT) and SiLU (x·σ(x), "swish", OPUS-MT's Marian models) are options; dropout
after the activation is optional (0 by default, as in the paper).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.errors import ConfigError
from aiayn.modules.dropout import Dropout

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


class FeedForward(nn.Module):
    """Linear(d_model → d_ff) → activation → Dropout → Linear(d_ff → d_model).

    Shape:
        x: (B, T, d_model) -> (B, T, d_model)
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        bias: bool = True,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ConfigError(f"activation={activation!r} is not one of {tuple(ACTIVATIONS)}")
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))
