"""Every limit of the server in one validated dataclass (``aiayn serve --help`` lists them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aiayn.errors import ConfigError
from aiayn.textfiles import read_text


@dataclass(frozen=True)
class Settings:
    char_limit: int = 5000  # characters per text (LibreTranslate's --char-limit)
    batch_limit: int = 32  # texts per request (LibreTranslate's --batch-limit)
    max_body_bytes: int = 1 << 20  # a larger request body is refused (413) before it is read whole
    queue_size: int = 64  # requests waiting for the model; one more is answered 429 with Retry-After
    batch_window_ms: float = 5.0  # how long the worker waits for more requests to decode together
    max_batch_texts: int = 64  # texts decoded together at most (0 = one request at a time)
    workers: int = 1  # batches decoded at once, each on its own thread (with 2+, give --threads 1)
    timeout_s: float = 60.0  # a request waiting longer is answered 503 and its slot freed
    max_new_tokens: int = 256  # /v1/generate: tokens per request at most
    max_beam: int = 16  # beam size at most
    api_keys: frozenset[str] = field(default_factory=frozenset)  # empty: no key needed

    def __post_init__(self) -> None:
        for name in (
            "char_limit",
            "batch_limit",
            "max_body_bytes",
            "queue_size",
            "max_new_tokens",
            "max_beam",
            "workers",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')}={value!r} must be a positive integer")
        if not isinstance(self.max_batch_texts, int) or self.max_batch_texts < 0:
            raise ConfigError(f"--max-batch-texts={self.max_batch_texts!r} must be ≥ 0 (0 = no batching)")
        if not 0 <= self.batch_window_ms <= 1000:
            raise ConfigError(f"--batch-window-ms={self.batch_window_ms} must be in [0, 1000]")
        if not 0 < self.timeout_s <= 3600:
            raise ConfigError(f"--timeout={self.timeout_s} must be in (0, 3600] seconds")


def read_api_keys(path: str | Path) -> frozenset[str]:
    """One key per line (blank lines and ``#`` comments skipped); an empty file is an error."""
    text = read_text(Path(path), "give a file with one API key per line", ConfigError)
    keys = frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))
    if not keys:
        raise ConfigError(f"{path} holds no API key; put one key per line")
    return keys
