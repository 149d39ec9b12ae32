"""Beam search, batched over sentences × beams (no Python loop over sentences per step).

Each sentence has K slots. At step t every live hypothesis h (raw log-probability s_h) is extended
by every token y; of all these candidates, the best ``K - f`` by s_h + log p(y | h) are kept, where
f is how many of the sentence's hypotheses have finished so far (Marian's shrinking beam). A kept
candidate that ends in eos, or that reaches the sentence's maximum length, is *finished* and
scored s / lp(|Y|) (``scoring.py``); the others stay live. With K = 1 this is greedy decoding.

**Stopping.** A sentence stops when it has no live hypothesis, or when no live hypothesis can beat
its ``nbest``-th best finished one. That bound is exact, not a heuristic: a live hypothesis of raw
score s ≤ 0 can only lose log-probability (every term is ≤ 0), and it will finish with a length L
between t + 2 and the maximum length L_max, so its final score is at most
s / max(lp(t + 2), lp(L_max)) — dividing a non-positive number by the largest lp the remaining
lengths allow (lp is monotone in L: increasing for α > 0, decreasing for α < 0). Finished
sentences leave the batch (``decoder.select``), the rest go on. A caller may stop the search between
two steps (``cancel.stop_when``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.decoding.adapters import IncrementalDecoder
from aiayn.decoding.cancel import check_stop
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.scoring import Hypothesis, length_penalty, to_hypotheses
from aiayn.decoding.steps import max_lengths, restrict
from aiayn.decoding.topk import topk
from aiayn.errors import ConfigError

BEAM = SearchConfig()  # the paper's: beam 4, α = 0.6

NEG_INF = float("-inf")


class _Finished:
    """Every sentence's finished hypotheses (at most K each: a slot finishes once).

    Shape:
        tokens (B, K, L_max), lengths (B, K), log_probs (B, K), scores (B, K), count (B,)
    """

    def __init__(self, n_inputs: int, beam: int, longest: int, pad_id: int, device: torch.device):
        self.tokens = torch.full((n_inputs, beam, longest), pad_id, dtype=torch.long, device=device)
        self.lengths = torch.ones(n_inputs, beam, dtype=torch.long, device=device)
        self.log_probs = torch.full((n_inputs, beam), NEG_INF, device=device)
        self.scores = torch.full((n_inputs, beam), NEG_INF, device=device)
        self.count = torch.zeros(n_inputs, dtype=torch.long, device=device)

    def add(self, finishing: Tensor, sentence: Tensor, cand: Tensor, tokens: Tensor, t: int, penalty: Tensor):
        """Store the candidates where ``finishing`` (A, K) is True, in each sentence's next free slots.

        ``sentence`` (A,) maps active to input index; ``cand`` (A, K) raw scores; ``tokens``
        (A, K, t + 1) generated ids; ``penalty`` = lp(t + 1).
        """
        a, j = finishing.nonzero(as_tuple=True)
        slot = (self.count[sentence][:, None] + finishing.cumsum(1) - 1)[a, j]
        b = sentence[a]
        self.tokens[b, slot, : t + 1] = tokens[a, j]
        self.lengths[b, slot] = t + 1
        self.log_probs[b, slot] = cand[a, j]
        self.scores[b, slot] = cand[a, j] / penalty
        self.count[sentence] += finishing.sum(1)

    def nth_best(self, sentence: Tensor, n: int) -> Tensor:
        """The n-th best finished score of each active sentence (-inf while it has fewer than n)."""
        return self.scores[sentence].topk(n, dim=1).values[:, -1]


@torch.inference_mode()
def beam_search(
    decoder: IncrementalDecoder,
    inputs: Tensor,
    max_len: int | Tensor,
    config: SearchConfig = BEAM,
) -> list[list[Hypothesis]]:
    """The ``config.nbest`` best-scoring hypotheses per input (best first), found with
    ``config.beam`` slots and ranked with ``config``'s length penalty.

    ``max_len`` (int or one per input) bounds the generated tokens, eos included; a hypothesis that
    reaches it without eos is finished as it stands. ``config.min_len`` forbids eos before that
    many tokens (``min_len = max_len`` gives outputs of fixed length, e.g. for benchmarks).
    """
    k, nbest, min_len = config.beam, config.nbest, config.min_len
    lenpen, lenpen_kind = config.lenpen, config.lenpen_kind
    prefix = decoder.start(inputs, k)  # (B·K, t0)
    t0, device = prefix.size(1), prefix.device
    n_inputs = prefix.size(0) // k
    limit = max_lengths(max_len, n_inputs).to(device)  # (B,)
    longest = int(limit.max())
    finished = _Finished(n_inputs, k, longest, decoder.pad_id, device)
    active = torch.arange(n_inputs, device=device)  # active sentence -> input index
    scores = torch.full((n_inputs, k), NEG_INF, device=device)  # raw log-probs; -inf = no hypothesis
    scores[:, 0] = 0.0  # the K rows start identical: expand one of them only
    slots = torch.arange(k, device=device)
    lp_max = length_penalty(limit, lenpen, lenpen_kind)  # (B,)
    for t in range(longest):
        check_stop()  # a caller that gave up stops the search here (cancel.py)
        n_active = active.numel()
        lp = restrict(decoder.step(prefix), decoder, t, min_len)  # (A·K, V)
        if k > lp.size(-1):
            raise ConfigError(f"beam={k} exceeds the vocabulary ({lp.size(-1)} tokens); use a smaller beam")
        # the K best of the K·V extensions come from the K best tokens of each hypothesis
        best_lp, best_token = topk(lp, k)  # (A·K, K)
        cand, index = (scores.view(-1, 1) + best_lp).view(n_active, k * k).topk(k, dim=1)  # (A, K)
        parent, token = index // k, best_token.view(n_active, k * k).gather(1, index)
        kept = (slots < k - finished.count[active][:, None]) & (cand > NEG_INF)
        ends = (token == decoder.eos_id) | (limit[active] <= t + 1)[:, None]
        finishing = kept & ends
        rows = (torch.arange(n_active, device=device)[:, None] * k + parent).view(-1)  # parent rows
        prefix = torch.cat([prefix[rows], token.view(-1, 1)], dim=1)  # (A·K, t0 + t + 1)
        scores = cand.masked_fill(~(kept & ~ends), NEG_INF)
        if finishing.any():
            generated = prefix[:, t0:].view(n_active, k, t + 1)
            finished.add(finishing, active, cand, generated, t, length_penalty(t + 1, lenpen, lenpen_kind))
        best_live = scores.amax(dim=1)  # (A,), -inf when nothing is live
        lp_bound = torch.maximum(lp_max[active], length_penalty(t + 2, lenpen, lenpen_kind))
        done = best_live / lp_bound <= finished.nth_best(active, nbest)  # -inf <= -inf: no live left
        if not done.any():
            decoder.reorder(rows)
            continue
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        keep_rows = (keep[:, None] * k + slots).view(-1)
        decoder.select(rows[keep_rows])
        prefix, scores, active = prefix[keep_rows], scores[keep], active[keep]

    order = finished.scores.argsort(dim=1, descending=True)[:, :nbest]  # (B, nbest)
    pick = torch.arange(n_inputs, device=device)[:, None], order
    return to_hypotheses(
        finished.tokens[pick].flatten(0, 1),
        finished.lengths[pick].flatten(),
        finished.log_probs[pick].flatten(),
        nbest,
        lenpen,
        lenpen_kind,
        sort=False,  # already best first
    )
