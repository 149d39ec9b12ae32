"""Every limit of the server in one validated dataclass (``aiayn serve --help`` lists them, and
docs/serve.md's "Limits"): what one request may ask for, how much the server holds at once, how long
it waits for a client. The flag of a field is its name with dashes, without a trailing ``_s``."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from aiayn.errors import ConfigError
from aiayn.textfiles import read_text

SCHEDULINGS = ("step", "batch")


@dataclass(frozen=True)
class Settings:
    # characters per text on /v1; per request, texts together, on /translate (LibreTranslate's --char-limit)
    char_limit: int = 5000
    batch_limit: int = 32  # texts per request (LibreTranslate's --batch-limit)
    sentence_limit: int = 512  # sentences /translate splits a request's texts into, at most
    # a larger request body is refused (413) before it is read whole; the default holds batch_limit texts
    # of char_limit characters however a client escapes them (JSON's \ud83d\ude00: 12 bytes a character)
    max_body_bytes: int = 2 << 20
    queue_size: int = 64  # requests waiting for the model; one more is answered 429 with Retry-After
    batch_window_ms: float = 5.0  # how long a whole batch waits for more requests (stepwise jobs join later)
    max_batch_texts: int = 64  # texts decoded together at most (0 = one request at a time)
    workers: int = 1  # batches decoded at once, each on its own thread (with 2+, give --threads 1)
    scheduling: str = (
        "step"  # "step": requests join a running search between its steps; "batch": whole searches
    )
    timeout_s: float = 60.0  # a request waiting longer is answered 503 and its slot freed
    max_new_tokens: int = 256  # /v1/generate: tokens per request at most
    max_beam: int = 16  # beam size, right-to-left beam and nbest (hypotheses or samples) at most
    max_len: int = 1024  # a request's max_len and min_len (output tokens per text) at most
    max_attention_values: int = 2_000_000  # attention weights one answer may carry (layers·heads·tokens²)
    max_connections: int = 512  # open connections; past it the oldest idle one is closed for the new one
    header_timeout_s: float = 10.0  # a request's headers must arrive within this (else the connection closes)
    body_timeout_s: float = 30.0  # a request's body must arrive within this (else 408)
    send_timeout_s: float = 30.0  # an answer not drained for this long (its client not reading) is cut off
    keep_alive_s: float = 5.0  # an idle connection is closed after this
    api_keys: frozenset[str] = field(default_factory=frozenset)  # empty: no key needed
    # the Host headers answered (lowercase names or addresses, no port); empty: any. aiayn serve on
    # loopback answers only its own names, so that a web page cannot reach it by DNS rebinding
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)
    # the pages of other sites whose scripts may read the answers (CORS, as LibreTranslate's own
    # "Access-Control-Allow-Origin: *"); empty: none, the browser's default. "*": any site
    cors_origins: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for name in (
            "char_limit",
            "batch_limit",
            "sentence_limit",
            "max_body_bytes",
            "queue_size",
            "max_new_tokens",
            "max_beam",
            "max_len",
            "max_attention_values",
            "max_connections",
            "workers",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"--{flag(name)}={value!r} must be a positive integer")
        if not isinstance(self.max_batch_texts, int) or self.max_batch_texts < 0:
            raise ConfigError(f"--max-batch-texts={self.max_batch_texts!r} must be ≥ 0 (0 = no batching)")
        if self.scheduling not in SCHEDULINGS:
            raise ConfigError(f"--scheduling={self.scheduling!r} is not one of {', '.join(SCHEDULINGS)} "
                              "(step: requests join a running search between decoding steps; batch: one "
                              "whole search per batch)")  # fmt: skip
        if not 0 <= self.batch_window_ms <= 1000:
            raise ConfigError(f"--batch-window-ms={self.batch_window_ms} must be in [0, 1000]")
        for origin in self.cors_origins - {"*"}:
            if not _is_origin(origin):
                raise ConfigError(f"--cors-origins: {origin!r} is not an origin; give scheme://host[:port] "
                                  "as browsers send it (https://example.org), or '*': any")  # fmt: skip
        for name in ("timeout_s", "header_timeout_s", "body_timeout_s", "send_timeout_s", "keep_alive_s"):
            value = getattr(self, name)
            if not 0 < value <= 3600:
                raise ConfigError(f"--{flag(name)}={value} must be in (0, 3600] seconds")


def _is_origin(text: str) -> bool:
    """Whether ``text`` is what a browser sends as ``Origin``: http(s)://host[:port], nothing more."""
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 -- a port that is not a number raises here
    except ValueError:  # "http://[zz"
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and not (parts.path or parts.query or parts.fragment or parts.username or parts.password)
    )


def flag(name: str) -> str:
    """The command-line flag of a ``Settings`` field, without the dashes: ``timeout_s`` -> ``timeout``."""
    return name.removesuffix("_s").replace("_", "-")


def read_api_keys(path: str | Path) -> frozenset[str]:
    """One key per line (blank lines and ``#`` comments, indented or not, skipped); an empty file is an
    error."""
    text = read_text(Path(path), "give a file with one API key per line", ConfigError)
    keys = frozenset(k for line in text.splitlines() if (k := line.strip()) and not k.startswith("#"))
    if not keys:
        raise ConfigError(f"{path} holds no API key; put one key per line")
    return keys
