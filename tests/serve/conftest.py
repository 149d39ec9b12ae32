"""Tiny model directories of every kind, for the server tests."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
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


def de_en_meta(path: Path) -> None:
    """Name the languages of a test translation model, as a training run records them."""
    meta = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**meta, "src_lang": "de", "tgt_lang": "en"}))


def post(url: str, body: dict) -> tuple[int, dict]:
    """POST ``body`` as JSON to the running server: (status, the JSON answer), errors included."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pair(tmp_path_factory) -> list[Path]:
    """Two random translation models with de-en's tokenizer, served as one ensemble ("pair"); on
    the tests' sentences it translates unlike either alone (checked where it is used)."""
    root = tmp_path_factory.mktemp("pair")
    dirs = [translation_dir(root / "a", seed=3, eos_bias=0.5), translation_dir(root / "b", seed=1)]
    de_en_meta(dirs[0])  # the ensemble takes the first member's languages
    return dirs


def idle_within(get_metrics, seconds: float, settle: float = 0.3) -> bool:
    """Whether the running searches come to hold no text (the ``aiayn_texts_in_flight`` gauge at 0,
    read ``settle`` seconds on end: a search about to start is not mistaken for one that stopped)
    within ``seconds``; ``get_metrics()`` returns the /metrics page. A search whose callers have left
    must stop at its next step: the next request's speed alone cannot tell, since by step it is
    decoded beside the abandoned search, not after it."""
    deadline, idle_since = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        if "\naiayn_texts_in_flight 0.0\n" not in get_metrics():
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= settle:
            return True
        time.sleep(0.02)
    return False


def start_serve(args: list[str], log: Path, preexec_fn=None) -> tuple[str, subprocess.Popen]:
    """``aiayn serve *args`` as its own process on a free port, once its /health answers:
    (base URL, process). Its output goes to ``log`` (a file, not a pipe: a full pipe would block it)."""
    port = free_port()
    argv = [sys.executable, "-m", "aiayn", "serve", *args, "--port", str(port), "--threads", "1"]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec_fn,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "health", timeout=1)
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"aiayn serve exited: {log.read_text()}")
            time.sleep(0.2)
    return url, proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)


@pytest.fixture(scope="session")
def server(served, pair, tmp_path_factory):
    """``aiayn serve`` as its own process on a free port: (base URL, process, log file). It serves
    de-en, lm, and the two ``pair`` models as one ensemble, "pair"."""
    de_en_meta(served["de-en"])
    ensemble = f"pair={pair[0]}{os.pathsep}{pair[1]}"
    models = ["--model", str(served["de-en"]), "--model", str(served["lm"]), "--model", ensemble]
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    url, proc = start_serve([*models, "--batch-window-ms", "20"], log)
    yield url, proc, log
    stop(proc)
