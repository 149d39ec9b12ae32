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

**A running batch.** The search state is a ``Beams`` object: ``step()`` advances every sentence by
one token and returns the sentences that are done, with their hypotheses, at once; ``join`` merges
another ``Beams`` (sentences that started later, e.g. a server's new request after its first step)
into it, so that sentences enter and leave between steps (iteration-level batching, Orca's
"selective batching"). Every quantity that depends on the step — the length limit, the minimum
length, the length penalty, the stopping bound — is kept per sentence, so a sentence decodes the
same whoever it shares the batch with. ``beam_search`` is one ``Beams`` stepped until it is empty.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.decoding.adapters import IncrementalDecoder
from aiayn.decoding.cancel import check_stop
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.scoring import Hypothesis, length_penalty, to_hypotheses
from aiayn.decoding.steps import FIRST_WIDTH, max_lengths, restrict, widen
from aiayn.decoding.topk import topk
from aiayn.errors import ConfigError

BEAM = SearchConfig()  # the paper's: beam 4, α = 0.6

NEG_INF = float("-inf")


class _Finished:
    """The finished hypotheses of each sentence of a batch (at most K each: a slot finishes once).

    Shape:
        tokens (A, K, L), widened as outputs grow; lengths, log_probs, scores (A, K); count (A,)
    """

    FIELDS = ("tokens", "lengths", "log_probs", "scores", "count")

    def __init__(self, n: int, beam: int, longest: int, pad_id: int, device: torch.device):
        self.pad_id = pad_id
        self.tokens = torch.full(
            (n, beam, min(longest, FIRST_WIDTH)), pad_id, dtype=torch.long, device=device
        )
        self.lengths = torch.ones(n, beam, dtype=torch.long, device=device)
        self.log_probs = torch.full((n, beam), NEG_INF, device=device)
        self.scores = torch.full((n, beam), NEG_INF, device=device)
        self.count = torch.zeros(n, dtype=torch.long, device=device)

    def add(self, finishing: Tensor, cand: Tensor, prefix: Tensor, t: Tensor, penalty: Tensor) -> None:
        """Store the candidates where ``finishing`` (A, K) is True, in each sentence's next free slots.

        ``cand`` (A, K) raw scores; ``prefix`` (A·K, W) every candidate's tokens, its ``t[a] + 1``
        generated ones last; ``penalty`` (A,) = lp(t + 1).
        """
        a, j = finishing.nonzero(as_tuple=True)
        slot = (self.count[:, None] + finishing.cumsum(1) - 1)[a, j]
        n, width = t[a] + 1, prefix.size(1)  # (F,) generated tokens of each finishing candidate
        if n.numel():
            self.tokens = widen(self.tokens, int(n.max()), self.pad_id)
        cols = torch.arange(self.tokens.size(2), device=prefix.device)
        where = (width - n[:, None] + cols).clamp(max=width - 1)  # (F, L_max): its tokens, then junk
        tokens = prefix[a * finishing.size(1) + j].gather(1, where)
        self.tokens[a, slot] = tokens.masked_fill(cols >= n[:, None], self.pad_id)
        self.lengths[a, slot] = n
        self.log_probs[a, slot] = cand[a, j]
        self.scores[a, slot] = cand[a, j] / penalty[a]
        self.count += finishing.sum(1)

    def nth_best(self, n: int) -> Tensor:
        """The n-th best finished score of each sentence (-inf while it has fewer than n)."""
        return self.scores.topk(n, dim=1).values[:, -1]

    def best(self, index: Tensor, nbest: int, lenpen: float, lenpen_kind: str) -> list[list[Hypothesis]]:
        """The ``nbest`` best hypotheses of each sentence in ``index``, best first (sorted here); fewer
        where fewer finished (a beam wider than the tokens a step may choose among), never an empty slot."""
        order = self.scores[index].argsort(dim=1, descending=True)[:, :nbest]  # (D, nbest)
        pick = index[:, None], order
        hyps = to_hypotheses(self.tokens[pick].flatten(0, 1), self.lengths[pick].flatten(),
                             self.log_probs[pick].flatten(), nbest, lenpen, lenpen_kind,
                             sort=False)  # fmt: skip
        return [h[: max(int(n), 1)] for h, n in zip(hyps, self.count[index].tolist(), strict=True)]

    def select(self, index: Tensor) -> None:
        for name in self.FIELDS:
            setattr(self, name, getattr(self, name)[index])

    def join(self, other: _Finished) -> None:
        longest = max(self.tokens.size(2), other.tokens.size(2))
        self.tokens = torch.cat([F.pad(x, (0, longest - x.size(2)), value=self.pad_id)
                                 for x in (self.tokens, other.tokens)])  # fmt: skip
        for name in self.FIELDS[1:]:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))


class Beams:
    """Sentences in beam search, and the decoder that holds their rows: the state of a search that
    ``step`` advances and ``join`` grows.

    ``tags`` name the sentences (any objects); ``step`` returns ``(tag, hypotheses)`` for each
    sentence that is done. Sentence a owns rows a·K … a·K + K - 1 of the decoder.

    Shape:
        inputs (B, S), max_len (B,) -> prefix (A·K, W): each row's tokens, right-aligned (rows of
        sentences that joined later are padded on the left; their decoder cache says where they start)
    """

    def __init__(self, decoder: IncrementalDecoder, inputs: Tensor, max_len: int | Tensor,
                 config: SearchConfig, tags: list | None = None):  # fmt: skip
        self.decoder, self.config, self.k = decoder, config, config.beam
        self.prefix = decoder.start(inputs, self.k)  # (B·K, t0)
        device = self.prefix.device
        n = self.prefix.size(0) // self.k
        self.tags = list(range(n)) if tags is None else list(tags)
        self.limit = max_lengths(max_len, n).to(device)  # (A,)
        self.t = torch.zeros(n, dtype=torch.long, device=device)  # (A,) tokens generated so far
        self.scores = torch.full((n, self.k), NEG_INF, device=device)  # raw log-probs; -inf = none
        self.scores[:, 0] = 0.0  # the K rows start identical: expand one of them only
        self.lp_max = length_penalty(self.limit, config.lenpen, config.lenpen_kind)  # (A,)
        longest = int(self.limit.max()) if n else 1  # an empty batch: nothing to decode
        self.finished = _Finished(n, self.k, longest, decoder.pad_id, device)

    def __len__(self) -> int:
        return len(self.tags)

    def step(self) -> list[tuple[object, list[Hypothesis]]]:
        """Every sentence one token further; the sentences that are done leave, with their
        ``config.nbest`` best hypotheses (best first)."""
        check_stop()  # a caller that gave up stops the search here (cancel.py)
        k, c, d, t = self.k, self.config, self.decoder, self.t
        n_active = len(self)
        lp = restrict(d.step(self.prefix), d, 1, 0)  # (A·K, V)
        if c.min_len:  # no eos before min_len tokens, sentence by sentence
            lp[:, d.eos_id] = lp[:, d.eos_id].masked_fill(t.repeat_interleave(k) < c.min_len, NEG_INF)
        if k > lp.size(-1):
            raise ConfigError(f"beam={k} exceeds the vocabulary ({lp.size(-1)} tokens); use a smaller beam")
        # the K best of the K·V extensions come from the K best tokens of each hypothesis
        best_lp, best_token = topk(lp, k)  # (A·K, K)
        cand, index = (self.scores.view(-1, 1) + best_lp).view(n_active, k * k).topk(k, dim=1)  # (A, K)
        parent, token = index // k, best_token.view(n_active, k * k).gather(1, index)
        slots = torch.arange(k, device=cand.device)
        kept = (slots < k - self.finished.count[:, None]) & (cand > NEG_INF)
        ends = (token == d.eos_id) | (self.limit <= t + 1)[:, None]
        finishing = kept & ends
        rows = (torch.arange(n_active, device=cand.device)[:, None] * k + parent).view(-1)  # parent rows
        self.prefix = torch.cat([self.prefix[rows], token.view(-1, 1)], dim=1)  # (A·K, W + 1)
        self.scores = cand.masked_fill(~(kept & ~ends), NEG_INF)
        if finishing.any():
            self.finished.add(finishing, cand, self.prefix, t, length_penalty(t + 1, c.lenpen, c.lenpen_kind))
        best_live = self.scores.amax(dim=1)  # (A,), -inf when nothing is live
        lp_bound = torch.maximum(self.lp_max, length_penalty(t + 2, c.lenpen, c.lenpen_kind))
        # no live hypothesis left (at max_len at the latest) is done whatever the ratio: with an α whose
        # lp overflows to inf, -inf / inf is NaN, and NaN <= x is never true; the bound needs nbest
        # finished ones (an lp that underflows to 0 makes the ratio -inf, "beaten" by an empty slot)
        enough = self.finished.count >= c.nbest
        done = ((best_live / lp_bound <= self.finished.nth_best(c.nbest)) & enough) | (best_live == NEG_INF)
        self.t = t + 1
        if not done.any():
            d.reorder(rows)
            return []
        finished = done.nonzero().squeeze(1)
        out = list(zip([self.tags[i] for i in finished.tolist()],
                       self.finished.best(finished, c.nbest, c.lenpen, c.lenpen_kind)))  # fmt: skip
        self._keep((~done).nonzero().squeeze(1), rows)
        return out

    def drop(self, tags: set) -> None:
        """Stop decoding the sentences ``tags`` (between two steps; their hypotheses are lost)."""
        keep = torch.tensor([i for i, tag in enumerate(self.tags) if tag not in tags], dtype=torch.long,
                            device=self.scores.device)  # fmt: skip
        if keep.numel() < len(self):
            self._keep(keep, torch.arange(self.prefix.size(0), device=keep.device))

    def _keep(self, keep: Tensor, rows: Tensor) -> None:
        """Only sentences ``keep`` go on; ``rows`` (A·K,) are the decoder rows the prefix rows came from."""
        self.tags = [self.tags[i] for i in keep.tolist()]
        if not keep.numel():
            return
        keep_rows = (keep[:, None] * self.k + torch.arange(self.k, device=keep.device)).view(-1)
        self.decoder.select(rows[keep_rows])
        self.prefix, self.scores = self.prefix[keep_rows], self.scores[keep]
        self.t, self.limit, self.lp_max = self.t[keep], self.limit[keep], self.lp_max[keep]
        self.finished.select(keep)
        cache = getattr(self.decoder, "cache", None)
        if cache is not None:  # positions that no row reads any more were dropped (kv_cache.py)
            self.prefix = self.prefix[:, -(len(cache) + 1) :]

    def join(self, other: Beams) -> None:
        """Add ``other``'s sentences (same model and search options, started later or earlier) to
        this batch: their rows come after these ones, and both decode on from where they are."""
        if other.config != self.config:
            raise ValueError("only sentences decoded with the same search options share a batch")
        if not len(self):
            self.__dict__.update(other.__dict__)
            return
        self.decoder.join(other.decoder)
        width = max(self.prefix.size(1), other.prefix.size(1))
        self.prefix = torch.cat([F.pad(x, (width - x.size(1), 0), value=self.decoder.pad_id)
                                 for x in (self.prefix, other.prefix)])  # fmt: skip
        self.tags += other.tags
        for name in ("limit", "t", "scores", "lp_max"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.finished.join(other.finished)


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
    beams = Beams(decoder, inputs, max_len, config)
    results: list[list[Hypothesis]] = [[] for _ in range(len(beams))]
    while len(beams):
        for i, hyps in beams.step():
            results[i] = hyps
    return results
