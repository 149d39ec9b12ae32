import pytest
import torch

from tests.helpers import MAX_DIFFS


@pytest.fixture(autouse=True, scope="session")
def _cache(tmp_path_factory):
    # encoded corpora go to one folder per test session (shared by its tests and the commands they
    # start), never into the checkout's .cache/aiayn: a stale or concurrent entry there stays out
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIAYN_CACHE_DIR", str(tmp_path_factory.mktemp("aiayn-cache")))
        yield


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_terminal_summary(terminalreporter):
    if MAX_DIFFS:
        terminalreporter.section("largest differences against references (max abs)")
        for name in sorted(MAX_DIFFS):
            terminalreporter.write_line(f"{name:<58} {MAX_DIFFS[name]:.2e}")
