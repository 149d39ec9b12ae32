"""Minimum Bayes-risk selection among a beam's hypotheses.

Beam search returns (about) the most probable output, which is not the output that scores best on
average: the model's probability mass is spread over many similar translations. MBR decoding (Kumar
& Byrne 2004; for NMT, Eikema & Aziz 2020 and Freitag et al. 2022) picks instead, among candidates
C, the one that agrees most with the others, each used as a pseudo-reference drawn from the model:

    y* = argmax_{c ∈ C}  1/(|C| − 1) · Σ_{c' ∈ C, c' ≠ c} u(c, c')

with uniform weights (the beam's n-best as the sample) and u a sentence-level metric computed by
sacreBLEU on the detokenised text: BLEU (with effective order, so short sentences score; tokenized for
the target language as ``aiayn evaluate`` scores it, or 13a's spaces would give Chinese 0 everywhere) or chrF.
It costs |C|·(|C| − 1) sentence scores per input, no model calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.decoding.bleu import bleu

UTILITIES = ("bleu", "chrf")


def expected_utilities(candidates: Sequence[str], utility: str = "bleu", tgt_lang: str = "") -> list[float]:
    """Each candidate's mean utility against every other candidate as the reference (0 when alone);
    BLEU tokenized for ``tgt_lang`` (``aiayn.decoding.bleu``)."""
    if utility not in UTILITIES:
        raise ValueError(f"utility={utility!r} is not one of {UTILITIES}")
    from sacrebleu.metrics import CHRF  # here: importing SearchConfig should not load sacreBLEU

    metric = bleu(tgt_lang, effective_order=True) if utility == "bleu" else CHRF()
    n = len(candidates)
    if n < 2:
        return [0.0] * n
    return [
        sum(metric.sentence_score(c, [r]).score for j, r in enumerate(candidates) if j != i) / (n - 1)
        for i, c in enumerate(candidates)
    ]


def mbr_order(candidates: Sequence[str], utility: str = "bleu", tgt_lang: str = "") -> list[int]:
    """Indices of ``candidates``, highest expected utility first; ties keep the given (beam) order."""
    u = expected_utilities(candidates, utility, tgt_lang)
    return sorted(range(len(candidates)), key=lambda i: -u[i])
