"""n-best reranking with a second model: the classic way to use a right-to-left model.

A left-to-right model's beam gives n hypotheses per sentence; a second model (usually one trained on
reversed targets, ``reverse_target=true``) scores each in one teacher-forced pass, and the list is
re-sorted by the sum of the two log-probabilities under one length penalty (Liu et al. 2016,
"Agreement on Target-bidirectional Neural Machine Translation"; Sennrich et al. 2016, WMT).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.decoding.options import SearchConfig
from aiayn.decoding.scoring import Hypothesis, length_penalty
from aiayn.decoding.translator import Translator
from aiayn.errors import ConfigError


def check_rerankable(translator: Translator, scorer: Translator) -> None:
    """The scorer must read the same vocabularies: ids are passed between the models as they are."""
    for side in ("src", "tgt"):
        ours, theirs = getattr(translator, f"{side}_tokenizer"), getattr(scorer, f"{side}_tokenizer")
        if ours.model_bytes() != theirs.model_bytes():
            raise ConfigError(
                f"--rerank-with: the reranking model's {side} vocabulary differs from the model's; train "
                "it on the same tokenizer (e.g. copy the run's tokenizer/ into its run directory first)"
            )


def rerank(
    translator: Translator,
    scorer: Translator,
    sources: Sequence[list[int]],
    nbest: list[list[Hypothesis]],
    config: SearchConfig,
) -> list[list[Hypothesis]]:
    """Each list re-sorted by (log p_model + log p_scorer) / lp(|y|); ``score`` holds that
    length-normalised sum, ``log_prob`` the model's own."""
    pairs = [(i, h) for i, hyps in enumerate(nbest) for h in hyps]
    targets = [translator.forward_order(h.tokens) for _, h in pairs]
    complete = [bool(h.tokens) and h.tokens[-1] == translator.model.config.eos_id for _, h in pairs]
    theirs = scorer.log_probs([sources[i] for i, _ in pairs], targets, complete) if pairs else []
    out: list[list[Hypothesis]] = [[] for _ in nbest]
    for (i, h), other in zip(pairs, theirs, strict=True):
        lp = float(length_penalty(len(h.tokens), config.lenpen, config.lenpen_kind))
        out[i].append(Hypothesis(h.tokens, (h.log_prob + other) / lp, h.log_prob, h.r2l))
    return [sorted(hyps, key=lambda h: -h.score) for hyps in out]
