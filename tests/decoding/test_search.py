"""Greedy, beam search and sampling: cached = uncached, beam 1 = greedy, beam ≥ greedy, the length
penalty and the exact stopping rule on hand-built distributions."""

import dataclasses
import math
import re

import pytest
import torch

from aiayn.decoding import (
    LMAdapter,
    SearchConfig,
    Seq2SeqAdapter,
    beam_search,
    greedy_search,
    length_penalty,
    sample,
    search,
)
from aiayn.errors import ConfigError
from tests.decoding.fixtures import FakeDecoder, padded_sources, tiny_lm, tiny_transformer
from tests.helpers import assert_close

CONFIGS = {
    "greedy": SearchConfig(beam=1),
    "beam": SearchConfig(beam=4, nbest=3),
    "beam-simple-penalty": SearchConfig(beam=3, lenpen=1.0, lenpen_kind="simple"),
    "sample": SearchConfig(sample=True, nbest=2, temperature=0.8, top_k=20, top_p=0.9, seed=3),
}


def _assert_same(name: str, a, b) -> None:
    assert [[h.tokens for h in hs] for hs in a] == [[h.tokens for h in hs] for hs in b], name
    assert_close(
        name,
        torch.tensor([[h.score for h in hs] for hs in a]),
        torch.tensor([[h.score for h in hs] for hs in b]),
        atol=1e-4,
    )


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_and_uncached_translation_agree(name, norm_first):
    model = tiny_transformer(eos_bias=4.0, norm_first=norm_first)
    cfg = CONFIGS[name]
    src = padded_sources()
    runs = [search(Seq2SeqAdapter(model, use_cache), src, cfg, 14) for use_cache in (True, False)]
    _assert_same(f"cached vs uncached decoding ({name})", *runs)
    assert len({len(h.tokens) for hs in runs[0] for h in hs}) > 1  # eos_bias: lengths vary


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_cached_and_uncached_lm_agree(name, positional):
    model = tiny_lm(positional=positional, norm_first=positional == "learned")
    prompt = torch.randint(4, 40, (2, 5), generator=torch.Generator().manual_seed(2))
    runs = [search(LMAdapter(model, use_cache), prompt, CONFIGS[name], 10) for use_cache in (True, False)]
    _assert_same(f"cached vs uncached LM decoding ({name})", *runs)


def test_a_sentence_decodes_the_same_alone_and_in_a_padded_batch():
    model, src = tiny_transformer(eos_bias=4.0), padded_sources()
    for cfg in (CONFIGS["greedy"], CONFIGS["beam"]):
        batched = search(Seq2SeqAdapter(model), src, cfg, 14)
        for i in range(len(src)):
            row = src[i : i + 1, : int((src[i] != 0).sum())]
            _assert_same(
                "one sentence alone vs in a batch",
                search(Seq2SeqAdapter(model), row, cfg, 14),
                batched[i : i + 1],
            )


@pytest.mark.parametrize("lenpen", [0.0, 0.6, 2.0])
def test_beam_size_one_is_greedy(lenpen):
    model = tiny_transformer(eos_bias=4.0)
    greedy = greedy_search(Seq2SeqAdapter(model), padded_sources(), 14, SearchConfig(beam=1, lenpen=lenpen))
    beam = beam_search(Seq2SeqAdapter(model), padded_sources(), 14, SearchConfig(beam=1, lenpen=lenpen))
    _assert_same("beam 1 vs greedy", beam, greedy)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lenpen", [0.0, 0.6])
def test_beam_is_never_worse_than_greedy(seed, lenpen):
    model = tiny_transformer(seed=seed, eos_bias=4.0)
    src = torch.randint(4, 50, (6, 8), generator=torch.Generator().manual_seed(seed))
    greedy = greedy_search(Seq2SeqAdapter(model), src, 12, SearchConfig(beam=1, lenpen=lenpen))
    beam = beam_search(Seq2SeqAdapter(model), src, 12, SearchConfig(beam=5, lenpen=lenpen))
    for g, b in zip(greedy, beam):
        assert b[0].score >= g[0].score - 1e-5


def test_nbest_lists_are_sorted_distinct_and_consistent():
    model = tiny_transformer(eos_bias=4.0)
    for hyps in beam_search(Seq2SeqAdapter(model), padded_sources(), 14, SearchConfig(beam=4, nbest=4)):
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4
        for h in hyps:
            assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens)).item(), rel=1e-5)
            assert 2 not in h.tokens[:-1]  # eos only at the end


def test_length_penalty_values():
    assert length_penalty(1, 0.6).item() == pytest.approx(1.0)
    assert length_penalty(7, 0.6).item() == pytest.approx(2**0.6)
    assert length_penalty(9, 0.5, "simple").item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="not one of"):
        length_penalty(3, 0.6, "log")


def test_max_and_min_length():
    model = tiny_transformer(eos_bias=4.0)
    limits = torch.tensor([3, 7, 5, 1])
    for hyps, limit in zip(
        beam_search(Seq2SeqAdapter(model), padded_sources(), limits, SearchConfig(beam=3, nbest=3)), limits
    ):
        assert all(len(h.tokens) <= limit for h in hyps)
    fixed = beam_search(
        Seq2SeqAdapter(model), padded_sources(), 9, SearchConfig(beam=3, min_len=9)
    )  # no eos: fixed length
    assert all(len(h[0].tokens) == 9 and 2 not in h[0].tokens for h in fixed)
    for hyps in greedy_search(Seq2SeqAdapter(model), padded_sources(), 9, SearchConfig(beam=1, min_len=4)):
        assert len(hyps[0].tokens) >= 4 and 2 not in hyps[0].tokens[:3]


def test_the_default_length_limit_grows_to_min_len():
    """A short input's default limit (input + max_len_b) cut the output ``min_len`` asked for, with
    no end, while an explicit max_len below min_len is refused."""
    config = SearchConfig(min_len=80)  # 80 tokens, then the earliest eos: 81 (before: 80, no eos possible)
    assert [config.output_limit(n) for n in (3, 30, 31, 100)] == [81, 81, 81, 150]
    assert SearchConfig(min_len=80, max_len=100).output_limit(3) == 100
    assert SearchConfig(min_len=80, max_len_cap=90).output_limit(3) == 81  # was 53: min_len cut short
    assert SearchConfig(min_len=80, max_len=80).output_limit(3) == 80  # fixed length: asked for, no eos


@pytest.mark.parametrize("beam", [1, 3])
def test_min_len_alone_leaves_room_for_the_end(tmp_path, beam):
    """With only ``min_len`` given, a short input's output ends with eos right after min_len tokens
    (a model that wants to stop); before, the default limit was min_len itself: cut, no eos."""
    from aiayn.decoding.translator import Translator
    from tests.decoding.fixtures import translation_dir

    t = Translator.from_dir(translation_dir(tmp_path / "m", eos_bias=4.0))
    src = t.encode(["ab"])[0]
    assert len(src[0]) + SearchConfig.max_len_b < 60  # the default limit is min_len's, not the input's
    hyp = t.search(src, SearchConfig(beam=beam, min_len=60))[0][0]
    assert len(hyp.tokens) == 61 and hyp.tokens[-1] == t.model.config.eos_id


@pytest.mark.parametrize("name", CONFIGS)
def test_outputs_past_the_first_buffer_width_are_decoded_as_with_a_buffer_of_max_len(name, monkeypatch):
    """Token buffers start FIRST_WIDTH wide and double; outputs of 80 tokens (min_len: no eos before)
    cross two widenings at width 16 and must equal the search whose buffers held max_len from the start."""
    from aiayn.decoding import beam, steps

    model, cfg = tiny_transformer(eos_bias=4.0), dataclasses.replace(CONFIGS[name], min_len=80)
    runs = []
    for width in (100, 16):
        monkeypatch.setattr(steps, "FIRST_WIDTH", width)
        monkeypatch.setattr(beam, "FIRST_WIDTH", width)
        runs.append(search(Seq2SeqAdapter(model), padded_sources(), cfg, 90))
    _assert_same(f"widened vs preallocated buffers ({name})", *runs)
    assert min(len(h.tokens) for hs in runs[0] for h in hs) >= 80


def test_a_huge_max_len_allocates_nothing_for_it():
    """max_len 10¹¹ allocated (sentences × beam × 10¹¹) tokens up front and failed; the eos-likely
    model's outputs end after a few tokens, as they do under max_len 14. (Beam search with α > 0 may
    not stop before max_len: a live hypothesis divided by lp(10¹¹) could still win, the exact
    stopping rule above; α = 0 stops once no live beam can beat the finished ones.)"""
    model, src = tiny_transformer(eos_bias=4.0), padded_sources()
    for cfg in (CONFIGS["greedy"], CONFIGS["sample"], SearchConfig(beam=4, nbest=3, lenpen=0.0)):
        _assert_same("max_len 10**11 vs 14", search(Seq2SeqAdapter(model), src, cfg, 10**11),
                     search(Seq2SeqAdapter(model), src, cfg, 14))  # fmt: skip


# -- hand-built distributions (FakeDecoder ids: eos 2, "a" 3, "b" 4) -------------------------------


def _short_or_long(generated):
    """eos now (p 0.5), or "a" (0.45) followed by an almost certain eos: better only with a penalty."""
    if not generated:
        return {2: 0.5, 3: 0.45, 4: 0.05}
    return {2: 0.99, 3: 0.005, 4: 0.005}


def test_the_length_penalty_picks_the_longer_hypothesis():
    one = torch.zeros(1, 1)
    assert beam_search(FakeDecoder(_short_or_long), one, 10, SearchConfig(beam=2, lenpen=0.0))[0][
        0
    ].tokens == [2]
    best = beam_search(FakeDecoder(_short_or_long), one, 10, SearchConfig(beam=2, lenpen=2.0))[0][0]
    assert best.tokens == [3, 2]
    raw = math.log(0.45) + math.log(0.99)
    assert best.log_prob == pytest.approx(raw, rel=1e-5)
    assert best.score == pytest.approx(raw / (7 / 6) ** 2, rel=1e-5)
    greedy = greedy_search(FakeDecoder(_short_or_long), one, 10, SearchConfig(beam=1, lenpen=2.0))[0][0]
    assert greedy.tokens == [2] and best.score > greedy.score


def _long_way_round(generated):
    """eos now (0.6), or "a" (0.4) then eight more near-certain "a"s and eos: length 10 in all."""
    if not generated:
        return {2: 0.6, 3: 0.4}
    if len(generated) < 9:
        return {3: 0.999, 2: 0.0005, 4: 0.0005}
    return {2: 0.999, 3: 0.0005, 4: 0.0005}


def test_the_stopping_rule_keeps_searching_while_a_live_beam_can_win():
    """After one step a finished [eos] (score -0.51) beats the live "a" (-0.92 / lp(2) = -0.67 at
    its current length, the heuristic that would stop here), but "a"×9 + eos scores -0.93 / lp(10)
    = -0.15 with α = 2: the exact bound s / lp(max_len) says go on, and the search finds it."""
    one = torch.zeros(1, 1)
    best = beam_search(FakeDecoder(_long_way_round), one, 20, SearchConfig(beam=2, lenpen=2.0))[0][0]
    assert best.tokens == [3] * 9 + [2]
    assert best.score > math.log(0.6)


def test_the_stopping_rule_stops_as_soon_as_no_live_beam_can_win():
    fake = FakeDecoder(_long_way_round)
    best = beam_search(fake, torch.zeros(1, 1), 20, SearchConfig(beam=2, lenpen=0.0))[0][0]
    assert best.tokens == [2] and fake.steps == 1  # raw -0.92 (live) can never beat -0.51


def _random_tree(seed: int):
    """Next-token probabilities over eos, "a", "b" drawn at random for each prefix (fixed by the
    prefix and the seed)."""

    def dist(generated):
        g = torch.Generator().manual_seed(seed * 1000003 + hash(tuple(generated)) % 1000003)
        p = (2.0 * torch.randn(3, generator=g)).softmax(0).tolist()
        return {2: p[0], 3: p[1], 4: p[2]}

    return dist


def _exhaustive_best(dist, max_len: int, alpha: float) -> tuple[list[int], float]:
    """argmax over every output up to max_len (ending in eos, or cut at max_len) of
    log p / lp(length), enumerated by hand."""
    best, frontier = ([], -math.inf), [([], 0.0)]
    for _ in range(max_len):
        grown = []
        for prefix, lp in frontier:
            for token, p in dist(prefix).items():
                y, total = [*prefix, token], lp + math.log(p)
                if token == 2 or len(y) == max_len:
                    score = total / ((5 + len(y)) / 6) ** alpha
                    best = max(best, (y, score), key=lambda c: c[1])
                else:
                    grown.append((y, total))
        frontier = grown
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
@pytest.mark.parametrize("seed", range(12))
def test_a_beam_as_wide_as_the_tree_finds_the_exhaustive_best(alpha, seed):
    """With as many beams as live prefixes can number (2² "a"/"b" prefixes before the last step,
    beam 5 = the vocabulary, the most allowed), beam search with the length penalty and its stopping
    rule must return what enumerating every output gives."""
    tokens, score = _exhaustive_best(_random_tree(seed), 3, alpha)
    config = SearchConfig(beam=5, lenpen=alpha)
    got = beam_search(FakeDecoder(_random_tree(seed)), torch.zeros(1, 1), 3, config)[0][0]
    assert got.tokens == tokens and got.score == pytest.approx(score, abs=1e-4)


def _never_past(limit):
    def dist(generated):
        assert len(generated) < limit, "the search went past max_len"
        return {2: 0.1, 3: 0.9}

    return dist


@pytest.mark.parametrize("lenpen", [1e30, -1e30, 3.4e38])
def test_the_search_ends_at_max_len_whatever_the_length_penalty(lenpen):
    """An α so large that lp overflows to inf (or 0) makes the bound's ratio NaN (-inf / inf); a
    sentence with no live hypothesis left is done all the same, at max_len at the latest. (SearchConfig
    refuses such an α, whose scores are ±inf: set past its check, the search still ends.)"""
    with pytest.raises(ConfigError, match=re.escape(f"lenpen={lenpen!r} must be within ±5")):
        SearchConfig(lenpen=lenpen)
    config = SearchConfig(beam=2, nbest=2)
    config.lenpen = lenpen
    fake = FakeDecoder(_never_past(5))
    hyps = beam_search(fake, torch.zeros(1, 1), 5, config)[0]
    assert fake.steps <= 5 and len(hyps) == 2 and all(len(h.tokens) <= 5 for h in hyps)


@pytest.mark.parametrize("config", [SearchConfig(beam=1), SearchConfig(), SearchConfig(sample=True, seed=0)])
def test_an_empty_batch_has_no_hypotheses(config):
    assert search(LMAdapter(tiny_lm()), torch.zeros(0, 3, dtype=torch.long), config, 5) == []
    strategy = (
        sample if config.sample else greedy_search if config.beam == 1 else beam_search
    )  # called directly
    assert strategy(LMAdapter(tiny_lm()), torch.zeros(0, 3, dtype=torch.long), 5, config) == []


@pytest.mark.parametrize("max_len", [1, 3])
def test_a_beam_wider_than_the_choosable_tokens_returns_only_real_hypotheses(max_len):
    """Of the fake's 5 ids, padding is never chosen: beam 5 can fill 4 slots at the first step, so
    with max_len 1 four hypotheses finish; every one returned has a finite score (no empty slot comes
    back as a hypothesis scored -inf)."""
    fake = FakeDecoder(lambda generated: {3: 0.5, 4: 0.3, 2: 0.2})
    (hyps,) = beam_search(fake, torch.zeros(1, 1), max_len, SearchConfig(beam=5, nbest=5))
    assert hyps and all(math.isfinite(h.score) and 0 not in h.tokens for h in hyps)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    if max_len == 1:  # eos, "a", "b" and bos (1e-9) after one token: the four choosable ids
        assert sorted(h.tokens for h in hyps) == [[1], [2], [3], [4]]


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    model = tiny_lm()
    prompt = torch.randint(4, 40, (2, 4), generator=torch.Generator().manual_seed(0))
    draws = [
        sample(LMAdapter(model), prompt, 12, SearchConfig(sample=True, nbest=3, seed=7)) for _ in range(2)
    ]
    assert [[h.tokens for h in hs] for hs in draws[0]] == [[h.tokens for h in hs] for hs in draws[1]]
    other = sample(LMAdapter(model), prompt, 12, SearchConfig(sample=True, nbest=3, seed=8))
    assert [[h.tokens for h in hs] for hs in other] != [[h.tokens for h in hs] for hs in draws[0]]
    top1 = sample(LMAdapter(model), prompt, 12, SearchConfig(sample=True, top_k=1, seed=0))
    _assert_same("sampling with top_k=1 vs greedy", top1, greedy_search(LMAdapter(model), prompt, 12))


def test_search_config_errors_name_the_field():
    cases = [
        (dict(beam=0), "beam=0"),
        (dict(beam=2, nbest=3), "nbest=3"),
        (dict(sample=True, temperature=0.0), "temperature"),
        (dict(sample=True, top_p=1.5), "top_p"),
        (dict(lenpen_kind="x"), "lenpen_kind"),
        (dict(max_len=0), "max_len=0"),
        # sampling's options without sampling would be ignored: each is refused instead
        (dict(temperature=0.5), "temperature=0.5 applies to sampling only"),
        (dict(beam=1, top_k=40), "top_k=40 applies to sampling only"),
        (dict(top_p=0.9), "top_p=0.9 applies to sampling only"),
        (dict(beam=1, seed=1), "seed=1 applies to sampling only"),
        # the input's length + max_len_b overflowed int64 in the limits' tensor: a traceback
        (dict(max_len_b=2**63 - 1), "max_len_b=9223372036854775807 is over 2147483647 tokens"),
        (dict(min_len=9, max_len=8), "min_len=9 is above max_len=8"),
        # max_len_b sets the default max_len only: with max_len it was silently ignored
        (dict(max_len=100, max_len_b=5), "max_len_b=5 does nothing with max_len=100"),
        (dict(min_len=9, max_len_cap=8), "min_len=9 is above max_len_cap=8"),  # a server's --max-len
    ]
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            SearchConfig(**bad)


def test_padding_is_never_generated():
    model = tiny_transformer(eos_bias=1.0)
    with torch.no_grad():
        model.head.bias[model.config.pad_id] = 50.0  # the model wants padding everywhere
    for cfg in (CONFIGS["greedy"], CONFIGS["beam"], CONFIGS["sample"]):
        for hyps in search(Seq2SeqAdapter(model), padded_sources(), cfg, 6):
            assert all(0 not in h.tokens for h in hyps)
