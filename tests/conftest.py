import pytest
import torch

from tests.helpers import MAX_DIFFS


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_terminal_summary(terminalreporter):
    if MAX_DIFFS:
        terminalreporter.section("largest differences against references (max abs)")
        for name in sorted(MAX_DIFFS):
            terminalreporter.write_line(f"{name:<58} {MAX_DIFFS[name]:.2e}")
