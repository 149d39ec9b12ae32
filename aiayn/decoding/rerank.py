"""n-best reranking with a second model: the classic way to use a right-to-left model.

A left-to-right model's beam gives n hypotheses per sentence; a second model (usually one trained on
reversed targets, ``reverse_target=true``) scores each in one teacher-forced pass, and the list is
re-sorted by the sum of the two log-probabilities under one length penalty (Liu et al. 2016,
"Agreement on Target-bidirectional Neural Machine Translation"; Sennrich et al. 2016, WMT).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Sequence

from aiayn.decoding.options import SearchConfig
from aiayn.decoding.scoring import Hypothesis, length_penalty
from aiayn.decoding.translator import DEFAULT_MAX_TOKENS, Translator
from aiayn.errors import ConfigError


def check_rerankable(translator: Translator, scorer: Translator) -> None:
    """The scorer must read the same vocabularies (ids are passed between the models as they are) and
    score given targets, which a bidirectional model does not: refused before anything is decoded."""
    if scorer.model.config.bidirectional:
        raise ConfigError(
            "--rerank-with: a bidirectional model does not score given targets (its memory is its own "
            "right-to-left search); rerank with a plain or right-to-left model"
        )
    if translator.tgt_lang and scorer.tgt_lang and translator.tgt_lang != scorer.tgt_lang:
        raise ConfigError(
            f"--rerank-with: the reranking model writes {scorer.tgt_lang!r}, the model "
            f"{translator.tgt_lang!r}; rerank with a model of the same language pair (a right-to-left one)"
        )
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


def check_rerank_search(config: SearchConfig) -> None:
    """Reranking re-sorts a beam: a ``ConfigError`` for a search it cannot re-sort (the CLI calls it
    before any model loads)."""
    if config.mbr:
        raise ConfigError("--rerank-with and --mbr both choose among a beam's n-best: give one of them")
    if config.sample or config.beam < 2:
        raise ConfigError("--rerank-with re-sorts a beam's n-best: give --beam 2 or more (and no --sample)")


def reranked_search(
    translator: Translator,
    scorer: Translator,
    sources: Sequence[list[int]],
    config: SearchConfig,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> list[list[Hypothesis]]:
    """The model's beam search keeping all ``config.beam`` hypotheses, re-sorted by ``rerank``;
    the ``config.nbest`` best of each."""
    check_rerank_search(config)
    searcher = within_reach(translator, scorer)
    nbest = searcher.search(sources, dataclasses.replace(config, nbest=config.beam), max_tokens)
    return [hyps[: config.nbest] for hyps in rerank(translator, scorer, sources, nbest, config)]


def within_reach(translator: Translator, scorer: Translator) -> Translator:
    """``translator``, its hypotheses no longer than ``scorer`` can read: a scorer with learned
    positions scores at most ``max_len`` target tokens (eos included), so the search stops there too
    rather than fail after it."""
    limit = scorer.max_tgt_len
    if limit is None or (translator.max_tgt_len is not None and translator.max_tgt_len <= limit):
        return translator
    bounded = copy.copy(translator)  # the same model and tokenizers, a shorter leash
    bounded.max_tgt_len = limit
    return bounded


class Reranked:
    """A translator whose beam's n-best a second model re-sorts (``Translator.translate`` with
    ``reranked_search``): what ``scripts/reproduce.py --rerank-with`` weighs on validation beside the
    model alone (for a bidirectional pipeline, its own right-to-left model: already trained, so free
    at equal time)."""

    def __init__(self, translator: Translator, scorer: Translator):
        check_rerankable(translator, scorer)
        self.translator, self.scorer = translator, scorer

    def translate(self, lines: Sequence[str], config: SearchConfig | None = None, **kwargs) -> list[str]:
        """The best reranked translation of every line (``""`` for a blank one)."""
        search = functools.partial(reranked_search, self.translator, self.scorer)
        return self.translator.translate(lines, config or SearchConfig(beam=5), search_fn=search, **kwargs)
