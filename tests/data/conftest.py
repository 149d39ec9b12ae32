import gzip

import pytest

from aiayn.data import SentencePieceTokenizer, encode_parallel, load_parallel


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """No test writes into the repository's .cache."""
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="session")
def m30k_tok():
    """A joint 8k BPE vocabulary on all of Multi30k train (about half a second)."""
    return SentencePieceTokenizer.train(load_parallel("multi30k", "train").sentences(), 8000)


@pytest.fixture(scope="session")
def m30k_train(m30k_tok, tmp_path_factory):
    """Multi30k train encoded with ``m30k_tok`` and the default filter, in a session cache."""
    corpus = load_parallel("multi30k", "train")
    return encode_parallel(corpus, m30k_tok, m30k_tok, cache=tmp_path_factory.mktemp("cache"))


def _write_lines(path, lines, end="\n"):
    data = "".join(line + end for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path


@pytest.fixture
def write_lines():
    """``write_lines(path, lines)``: UTF-8 text, one line each, gzipped when the name ends .gz."""
    return _write_lines
