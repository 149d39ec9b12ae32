"""A caller stops any search between two steps (``cancel.stop_when``), and a search it lets run
returns exactly what it returns without the check."""

import pytest
import torch

from aiayn.decoding import SearchConfig, Seq2SeqAdapter, search
from aiayn.decoding.cancel import SearchStopped, check_stop, stop_when
from tests.decoding.fixtures import tiny_transformer

CONFIGS = {
    "greedy": SearchConfig(beam=1, min_len=20),
    "beam": SearchConfig(beam=3, nbest=2, min_len=20),
    "sample": SearchConfig(sample=True, nbest=2, seed=3, min_len=20),
}


class CountingAdapter(Seq2SeqAdapter):
    steps = 0

    def step(self, prefix):
        self.steps += 1
        return super().step(prefix)


@pytest.mark.parametrize("name", CONFIGS)
def test_a_search_stops_at_the_first_step_after_its_caller_gives_up(name):
    model, src = tiny_transformer(), torch.randint(4, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    adapter, checks = CountingAdapter(model), []

    def should_stop() -> bool:
        checks.append(1)
        return len(checks) > 3  # three steps run, the fourth check stops

    with stop_when(should_stop), pytest.raises(SearchStopped):
        search(adapter, src, CONFIGS[name], 40)
    assert adapter.steps == 3


@pytest.mark.parametrize("name", CONFIGS)
def test_a_search_let_run_returns_what_it_returns_unchecked(name):
    model, src = tiny_transformer(), torch.randint(4, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    plain = search(Seq2SeqAdapter(model), src, CONFIGS[name], 30)
    with stop_when(lambda: False):
        checked = search(Seq2SeqAdapter(model), src, CONFIGS[name], 30)
    assert [[(h.tokens, h.score) for h in hs] for hs in plain] == [
        [(h.tokens, h.score) for h in hs] for hs in checked
    ]


def test_the_check_is_scoped_to_the_block():
    with stop_when(lambda: True), pytest.raises(SearchStopped):
        check_stop()
    check_stop()  # outside: nothing asked to stop
