"""Ancestral sampling with temperature, top-k and top-p (nucleus) filtering, seeded.

    y_t ~ softmax(filter(log p(· | y_<t, X) / T))

``filter`` keeps the ``top_k`` most probable tokens, then the smallest set of tokens whose
probability sums to at least ``top_p`` (Holtzman et al. 2020); the most probable token always
survives. Draws come from a ``torch.Generator`` seeded with ``seed``, so a seed fixes the output; a
caller that samples batch after batch passes one ``generator`` to all of them, so that the draws go on
from batch to batch instead of starting again (same draws for every batch: correlated samples). With
``streams`` (``sentence_streams``: one generator per sample of each sentence, seeded by the seed, the
sentence's own ids and how many times the same ids came before it in its file or request), a sentence's
samples do not depend on what else is in its batch: the same text and seed give the same samples alone,
in a file or beside other requests in the server, and a line repeated gets new samples each time.
The returned ``log_prob`` is the model's own (T = 1, unfiltered) log-probability of the sample.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

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
        kept = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, topk(logits, top_k)[1], True)
        logits = logits.masked_fill(~kept, float("-inf"))  # by index: a tie with the k-th stays out
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
    streams: list[torch.Generator] | None = None,
) -> list[list[Hypothesis]]:
    """``config.nbest`` samples per input, in the order drawn, with ``config``'s temperature, top-k,
    top-p and min_len; drawn from ``streams`` (one generator per output row: input i's k-th sample is
    row i·nbest + k), else from ``generator``, else from one seeded with ``config.seed``, else (seed None)
    from torch's global RNG."""
    c = config
    if streams is not None:
        pick = lambda lp, rows: draw(lp, c, streams=[streams[r] for r in rows.tolist()])  # noqa: E731
    else:
        generator = generator if generator is not None else seeded(c, inputs.device)
        pick = lambda lp, rows: draw(lp, c, generator)  # noqa: E731
    tokens, lengths, log_probs = decode_rows(decoder, inputs, c.nbest, pick, max_len, c.min_len)
    return to_hypotheses(tokens, lengths, log_probs, c.nbest, c.lenpen, c.lenpen_kind, sort=False)


def draw(
    log_probs: Tensor,
    config: SearchConfig,
    generator: torch.Generator | None = None,
    streams: Sequence[torch.Generator] | None = None,
) -> Tensor:
    """One token per row from ``softmax(filter(log_probs / T))``: from ``generator`` (one draw for the
    whole batch), or with ``streams`` one uniform u per row from its own generator, the token the first
    whose cumulative probability passes u (inverse transform sampling: a zero-probability token is never it).

    Shape:
        log_probs: (N, V) -> (N,)
    """
    probs = filter_logits(log_probs / config.temperature, config.top_k, config.top_p).softmax(-1)
    if streams is None:
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    cdf = probs.float().cumsum(-1)  # (N, V)
    u = torch.stack([torch.rand((), generator=g) for g in streams]).to(cdf.device)  # (N,) in [0, 1)
    chosen = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
    return chosen.clamp(max=probs.size(-1) - 1)


def occurrences(sources: Sequence[Sequence[int]], seen: Counter | None = None) -> list[int]:
    """How many times each source's ids came before it (in ``sources``, and in ``seen``, which counts
    on: a caller reading a file chunk by chunk passes one; it holds 8 bytes a distinct line)."""
    seen = Counter() if seen is None else seen
    out = []
    for ids in sources:
        key = hashlib.blake2b(repr(list(ids)).encode(), digest_size=8).digest()
        out.append(seen[key])
        seen[key] += 1
    return out


def sentence_streams(
    config: SearchConfig, sources: Sequence[Sequence[int]], repeats: Sequence[int]
) -> list[torch.Generator] | None:
    """With ``config.seed``: one generator per sample of each source (``nbest`` each, source-major), seeded
    by the seed, the source's ids, its ``repeats`` (``occurrences``) and the sample's index, so that its
    draws depend on nothing else. None without a seed (torch's global RNG, as ``seeded``)."""
    if not config.sample or config.seed is None:
        return None
    streams = []
    for ids, repeat in zip(sources, repeats):
        for k in range(config.nbest):
            key = hashlib.blake2b(repr((config.seed, list(ids), repeat, k)).encode(), digest_size=8).digest()
            streams.append(torch.Generator().manual_seed(int.from_bytes(key, "little")))
    return streams
