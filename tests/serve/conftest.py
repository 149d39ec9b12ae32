"""Tiny model directories of every kind, for the server tests."""

from pathlib import Path

import pytest

from tests.cli.test_encoder_cli import TEXTS, encoder_dir
from tests.decoding.fixtures import lm_dir, translation_dir


@pytest.fixture(scope="session")
def served(tmp_path_factory) -> dict[str, Path]:
    from aiayn.data import SentencePieceTokenizer

    root = tmp_path_factory.mktemp("served")
    tok = SentencePieceTokenizer.train(TEXTS, 300, mask=True)
    return {
        "de-en": translation_dir(root / "de-en", eos_bias=2.0),
        "lm": lm_dir(root / "lm"),
        "sentiment": encoder_dir(root / "sentiment", tok, 2),
        "mlm": encoder_dir(root / "mlm", tok, 0),
    }
