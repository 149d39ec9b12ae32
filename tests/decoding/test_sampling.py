"""Top-k and top-p filtering on hand-computed distributions, and samples drawn with temperature,
top-k and top-p against the distribution they should follow."""

import math

import pytest
import torch

from aiayn.decoding import SearchConfig, filter_logits, sample
from aiayn.decoding.sampling import draw
from tests.decoding.fixtures import FakeDecoder

PROBS = [0.05, 0.5, 0.15, 0.3]  # sorted: 0.5, 0.3, 0.15, 0.05


def _kept(**kw) -> list[bool]:
    logits = torch.tensor([[math.log(p) for p in PROBS]])
    return filter_logits(logits, **kw)[0].isfinite().tolist()


def test_top_k_keeps_the_k_most_probable():
    assert _kept(top_k=2) == [False, True, False, True]
    assert _kept(top_k=10) == [True] * 4


def test_top_k_keeps_k_tokens_when_others_tie_with_the_kth():
    """Ties with the k-th logit (bf16 logits round near-equal ones together) were all kept: top_k=1
    sampled from several tokens, not greedily."""
    tied = filter_logits(torch.tensor([[5.0, 5.0, 1.0], [1.0, 3.0, 3.0]]), top_k=1).isfinite()
    assert tied.sum(-1).tolist() == [1, 1]  # which of the tied ones stays is topk's choice
    assert not tied[0, 2] and not tied[1, 0]


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert _kept(top_p=0.79) == [False, True, False, True]  # 0.5 + 0.3 reaches 0.79
    assert _kept(top_p=0.81) == [False, True, True, True]
    assert _kept(top_p=0.1) == [False, True, False, False]  # the most probable token always stays
    assert _kept(top_p=1.0) == [True] * 4
    assert _kept(top_p=1e-46) == [False, True, False, False]  # 0 in float32: still the most probable


def test_top_k_then_top_p():
    assert _kept(top_k=3, top_p=0.9) == [False, True, True, True]
    assert _kept(top_k=1, top_p=0.99) == [False, True, False, False]


FIRST = {2: 0.1, 3: 0.6, 4: 0.3}  # eos, "a", "b"; then eos for certain


def _first_tokens(n: int, **kw) -> tuple[dict[int, float], list]:
    """The frequencies of the first token over ``n`` samples of ``sample`` (one input, nbest n)."""
    decoder = FakeDecoder(lambda done: FIRST if not done else {2: 1.0})
    hyps = sample(
        decoder, torch.zeros(1, 1, dtype=torch.long), 3, SearchConfig(sample=True, nbest=n, seed=0, **kw)
    )
    firsts = [h.tokens[0] for h in hyps[0]]
    return {t: firsts.count(t) / n for t in FIRST}, hyps[0]


def _expected(temperature: float = 1.0, kept=(2, 3, 4)) -> dict[int, float]:
    """p^(1/T) over the kept tokens, renormalised, by hand."""
    w = {t: FIRST[t] ** (1 / temperature) if t in kept else 0.0 for t in FIRST}
    return {t: v / sum(w.values()) for t, v in w.items()}


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, _expected()),
        ({"temperature": 2.0}, _expected(2.0)),  # flatter: p^(1/2)
        ({"temperature": 0.5}, _expected(0.5)),  # sharper: p^2
        ({"top_p": 0.8}, _expected(kept=(3, 4))),  # 0.6 + 0.3 reaches 0.8: eos is left out
        ({"top_k": 1, "temperature": 2.0}, _expected(kept=(3,))),
    ],
)
def test_samples_follow_the_filtered_tempered_distribution(kw, expected):
    n = 20000
    freq, hyps = _first_tokens(n, **kw)
    for t, p in expected.items():  # 5 standard deviations of a frequency over n draws
        assert abs(freq[t] - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-9, (t, freq[t], p)
    h = next(h for h in hyps if h.tokens[0] == 3)  # "a" then eos: the model's own log-probability
    assert h.tokens == [3, 2] and h.log_prob == pytest.approx(math.log(0.6), abs=1e-5)


@pytest.mark.parametrize(
    ("kw", "expected"), [({"temperature": 2.0}, _expected(2.0)), ({"top_p": 0.8}, _expected(kept=(3, 4)))]
)
def test_per_sentence_streams_draw_the_same_distribution(kw, expected):
    """A seeded translation draws by inverse transform from one generator per row (``sentence_streams``):
    the same filtered, tempered distribution as the batch's multinomial."""
    n = 20000
    log_probs = torch.full((n, 5), float("-inf"))  # pad and bos never: only the three tokens
    for t, p in FIRST.items():
        log_probs[:, t] = math.log(p)
    streams = [torch.Generator().manual_seed(i) for i in range(n)]
    chosen = draw(log_probs, SearchConfig(sample=True, **kw), streams=streams).tolist()
    for t, p in expected.items():
        freq = chosen.count(t) / n
        assert abs(freq - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-9, (t, freq, p)
    assert set(chosen) <= {t for t, p in expected.items() if p > 0}  # never a filtered token
