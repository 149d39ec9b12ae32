"""Ancestral sampling with temperature, top-k and top-p (nucleus) filtering, seeded.

    y_t ~ softmax(filter(log p(· | y_<t, X) / T))

``filter`` keeps the ``top_k`` most probable tokens, then the smallest set of tokens whose
probability sums to at least ``top_p`` (Holtzman et al. 2020); the most probable token always
survives. Draws come from a ``torch.Generator`` seeded with ``seed``, so a seed fixes the output; a
caller that samples batch after batch passes one ``generator`` to all of them, so that the draws go on
from batch to batch instead of starting again (same draws for every batch: correlated samples).
The returned ``log_prob`` is the model's own (T = 1, unfiltered) log-probability of the sample.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.decoding.adapters import IncrementalDecoder
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.scoring import Hypothesis, to_hypotheses
from aiayn.decoding.steps import decode_rows
from aiayn.decoding.topk import topk

SAMPLING = SearchConfig(sample=True)


def seeded(config: SearchConfig, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator seeded with ``config.seed`` (None: no seed, or no sampling)."""
    if not config.sample or config.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(config.seed)


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set every token outside the top-k and outside the top-p nucleus to -inf.

    Shape:
        logits: (N, V) -> (N, V)
    """
    if top_k is not None and top_k < logits.size(-1):
        kth = topk(logits, top_k)[0][:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach top_p; the first one always stays (a
        # top_p under float32's smallest number is 0 there, which the ones before the first reach)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop_sorted[:, 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@torch.inference_mode()
def sample(
    decoder: IncrementalDecoder,
    inputs: Tensor,
    max_len: int | Tensor,
    config: SearchConfig = SAMPLING,
    generator: torch.Generator | None = None,
) -> list[list[Hypothesis]]:
    """``config.nbest`` samples per input, in the order drawn, with ``config``'s temperature, top-k,
    top-p and min_len; drawn from ``generator``, else from one seeded with ``config.seed``, else
    (seed None) from torch's global RNG."""
    c = config
    if generator is None:
        generator = seeded(c, inputs.device)
    pick = lambda lp: draw(lp, c, generator)  # noqa: E731
    tokens, lengths, log_probs = decode_rows(decoder, inputs, c.nbest, pick, max_len, c.min_len)
    return to_hypotheses(tokens, lengths, log_probs, c.nbest, c.lenpen, c.lenpen_kind, sort=False)


def draw(log_probs: Tensor, config: SearchConfig, generator: torch.Generator | None = None) -> Tensor:
    """One token per row from ``softmax(filter(log_probs / T))``.

    Shape:
        log_probs: (N, V) -> (N,)
    """
    probs = filter_logits(log_probs / config.temperature, config.top_k, config.top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)
