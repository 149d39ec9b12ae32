"""Iteration-level batching: sentences that join a running search late, or leave it early, decode
exactly as they would alone (same tokens, same scores), whatever they share the batch with."""

import pytest
import torch

from aiayn.decoding import SearchConfig, Seq2SeqAdapter, beam_search, greedy_search
from aiayn.decoding.adapters import R2LAdapter
from aiayn.decoding.running import RunningSearch
from aiayn.models.ensemble import Ensemble
from tests.decoding.fixtures import tiny_transformer
from tests.helpers import assert_close

CONFIGS = {"beam": SearchConfig(beam=4, nbest=2), "greedy": SearchConfig(beam=1),
           "min-len": SearchConfig(beam=3, min_len=3, lenpen=1.0)}  # fmt: skip


def _sentences(n: int = 7, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(4, 50, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g) for _ in range(n)
    ]


def _alone(model, src: torch.Tensor, limit: int, config: SearchConfig):
    search = greedy_search if config.beam == 1 else beam_search
    return search(Seq2SeqAdapter(model), src[None], limit, config)[0]


def _padded(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0)


def _same(name, got, want) -> None:
    assert [h.tokens for h in got] == [h.tokens for h in want], name
    assert_close(name, torch.tensor([h.score for h in got]), torch.tensor([h.score for h in want]), atol=1e-5)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("positional,norm_first", [("sinusoidal", False), ("learned", True)])
def test_sentences_joining_and_leaving_a_running_search_decode_as_alone(name, positional, norm_first):
    model = tiny_transformer(
        eos_bias=3.0 if positional == "sinusoidal" else 0.5, positional=positional, norm_first=norm_first
    )
    config, sentences = CONFIGS[name], _sentences()
    limits = [6 + i % 5 for i in range(len(sentences))]
    running, results, joined_at = RunningSearch(model, config), {}, {}
    # step -> the groups of sentences that arrive then (two groups at once: two joins before a step)
    arrivals = {0: [[0, 1]], 2: [[2]], 3: [[3], [4]], 7: [[5]], 8: [[6]]}
    step = 0
    while step <= max(arrivals) or len(running):
        for tags in arrivals.get(step, []):
            running.add(_padded([sentences[i] for i in tags]), torch.tensor([limits[i] for i in tags]), tags)
            joined_at.update({i: step for i in tags})
        results.update(running.step())
        step += 1
    assert sorted(results) == list(range(len(sentences)))
    for i, src in enumerate(sentences):
        _same(
            f"running search vs alone ({name}, sentence {i}, joined at step {joined_at[i]})",
            results[i],
            _alone(model, src, limits[i], config),
        )
    lengths = {len(results[i][0].tokens) for i in results}
    assert len(lengths) > 2  # sentences left at different steps


def test_the_cache_forgets_positions_no_row_reads_and_realigns():
    model, sentences = tiny_transformer(eos_bias=3.0), _sentences()
    running = RunningSearch(model, SearchConfig(beam=2))
    running.add(_padded(sentences[:1]), torch.tensor([3]), [0])
    for _ in range(1):
        running.step()
    running.add(_padded(sentences[1:2]), torch.tensor([12]), [1])
    cache = running.beams.decoder.cache
    assert cache.offsets is not None and cache.offsets.tolist() == [0, 0, 1, 1]  # joined one step later
    assert cache.layers[0]["cross"].k.size(0) == 2  # one memory row per sentence
    done = []
    while 0 not in [tag for tag, _ in done]:
        done += running.step()
    cache = running.beams.decoder.cache
    assert cache.offsets is None  # sentence 0 left: its earlier positions were dropped
    assert len(cache) + 1 == running.beams.prefix.size(1)
    while len(running):
        done += running.step()
    _same("after realignment", dict(done)[1], _alone(model, sentences[1], 12, SearchConfig(beam=2)))


def test_dropped_sentences_leave_and_the_others_go_on():
    model, sentences = tiny_transformer(eos_bias=1.0), _sentences(3)
    running = RunningSearch(model, SearchConfig(beam=3))
    running.add(_padded(sentences), torch.tensor([10, 10, 10]), ["a", "b", "c"])
    running.drop({"b"})
    assert len(running) == 2 and running.rows == 6
    done = {}
    while len(running):
        done.update(running.step())
    assert sorted(done) == ["a", "c"]
    _same("after a drop", done["c"], _alone(model, sentences[2], 10, SearchConfig(beam=3)))


@pytest.mark.parametrize("name", CONFIGS)
def test_a_sentence_dropped_mid_search_leaves_the_others_as_they_decode_alone(name):
    """Dropped after some steps (its beams reordered by then, and rows realigned by a later join),
    not only before the first: the others' tokens and scores are still those of decoding alone."""
    model, config, sentences = tiny_transformer(eos_bias=0.5), CONFIGS[name], _sentences(4, seed=3)
    running, done = RunningSearch(model, config), {}
    running.add(_padded(sentences[:3]), torch.tensor([12, 12, 12]), ["a", "b", "c"])
    for _ in range(3):
        done.update(running.step())
    running.add(_padded(sentences[3:]), torch.tensor([12]), ["d"])  # joins late: rows realigned
    done.update(running.step())
    assert "b" not in done  # still decoding: dropped mid-search, not after it ended
    running.drop({"b"})
    while len(running):
        done.update(running.step())
    assert sorted(done) == ["a", "c", "d"]
    for tag, src in zip("acd", [sentences[0], sentences[2], sentences[3]], strict=True):
        _same(f"{name}: {tag} after b left mid-search", done[tag], _alone(model, src, 12, config))


def test_only_plain_searches_run():
    with pytest.raises(ValueError, match="plain model"):
        RunningSearch(tiny_transformer(), SearchConfig(sample=True))
    with pytest.raises(ValueError, match="plain model"):  # an ensemble failed later, on a missing method
        RunningSearch(Ensemble([tiny_transformer(), tiny_transformer()]), SearchConfig())


@pytest.mark.parametrize("adapter", [Seq2SeqAdapter, R2LAdapter])
def test_prime_caches_what_the_first_step_would(adapter):
    """Of its own decoder: the right-to-left one's cross-attention for a right-to-left pass."""
    model, src = tiny_transformer(bidirectional=adapter is R2LAdapter), _padded(_sentences(3))
    primed, stepped = adapter(model), adapter(model)
    primed.start(src, 4)
    primed.prime()
    stepped.step(stepped.start(src, 4))
    for a, b in zip(primed.cache.layers, stepped.cache.layers, strict=True):
        assert a["cross"].k.shape == (3, 4, src.size(1), 8)  # per sentence, not per beam
        torch.testing.assert_close(a["cross"].k, b["cross"].k)
        torch.testing.assert_close(a["cross"].v, b["cross"].v)
        assert len(a["self"]) == 0 and a["self"].k.size(0) == 12
