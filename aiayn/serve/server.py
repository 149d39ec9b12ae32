"""What the routes share: the loaded models, the batcher that runs them, the settings and the metrics.

One ``Server`` lives on ``app.state.server`` (``dependencies.get_server`` hands it to a route). It
turns the batcher's outcomes into the HTTP errors LibreTranslate answers (429 with ``Retry-After``
for a full queue, 503 past the timeout, 400 for a request the model refuses, or the status an
``AiaynError`` carries) and applies the limits that depend on the settings: every item of a request
is checked before it joins a batch (``texts``), every decoding option that sets how much work a
search does has a bound (``BOUNDS``), and ``stuck`` says when no worker can take new work.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from fastapi import Request
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from aiayn.decoding.options import SearchConfig
from aiayn.device import set_threads
from aiayn.errors import AiaynError
from aiayn.serve.batcher import Batcher, QueueFull
from aiayn.serve.jobs import JobKind
from aiayn.serve.sentences import Sentences
from aiayn.serve.settings import Settings


class HTTPError(Exception):
    """An answer ``{"error": message}`` with this status (the app's exception handler sends it)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def invalid(problem: str) -> HTTPError:
    """LibreTranslate's answer to a bad request: 400, "Invalid request: …"."""
    return HTTPError(400, f"Invalid request: {problem}")


# each decoding option that sets how much work one search does, and the setting that bounds it
BOUNDS = {"beam": "max_beam", "r2l_beam": "max_beam", "nbest": "max_beam", "max_len": "max_len",
          "min_len": "max_len", "max_len_b": "max_len"}  # fmt: skip


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be decoded (None if it can): every text a model reads is UTF-8, which a
    lone surrogate (JSON's ``"\\ud800"``) is not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"is not valid Unicode ({e.reason} at character {e.start})"
    return None


class Metrics:
    """Prometheus metrics of one app (its own registry, so that several apps can live in a process)."""

    def __init__(self, depth, in_flight):
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "aiayn_requests", "Requests by route and status", ["route", "status"], registry=r
        )
        seconds = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
        self.latency = Histogram(
            "aiayn_request_seconds", "Request latency", ["route"], registry=r, buckets=seconds
        )
        self.batch = Histogram("aiayn_batch_texts", "Texts decoded together per batch (per decoding step "
                               "when scheduling by step)", registry=r,
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128))  # fmt: skip
        # throughput is PromQL's: rate(aiayn_output_tokens_total[1m]); while decoding, divided by
        # rate(aiayn_decode_seconds_total[1m]) (busy seconds, summed over the workers)
        self.tokens = Counter("aiayn_output_tokens", "Output tokens produced", registry=r)
        self.decode_seconds = Counter(
            "aiayn_decode_seconds", "Seconds the workers spent on batches and decoding steps", registry=r
        )
        Gauge("aiayn_queue_depth", "Requests waiting for the model", registry=r).set_function(depth)
        Gauge("aiayn_texts_in_flight", "Texts in running searches (decoded step by step)",
              registry=r).set_function(in_flight)  # fmt: skip
        self.waiting = Histogram("aiayn_wait_seconds", "Time a request waited before decoding started",
                                 registry=r, buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                                      5, 10, 30, 60))  # fmt: skip


class Server:
    """The models (by name), the batcher and the settings behind the routes; each worker thread runs
    with ``threads`` PyTorch CPU threads (0: PyTorch's default)."""

    def __init__(self, services: list, settings: Settings, threads: int = 0):
        if not services:
            raise AiaynError("give at least one --model")
        self.services, self.settings = {s.name: s for s in services}, settings
        self.metrics = Metrics(lambda: self.batcher.depth(), lambda: self.batcher.in_flight())
        self.batcher = Batcher(self._run, settings.queue_size, settings.batch_window_ms / 1000,
                               settings.max_batch_texts, self._on_batch, settings.workers,
                               self._stepwise, self.metrics.waiting.observe,
                               lambda: set_threads(threads))  # fmt: skip
        self._batch = threading.local()  # each worker's last batch: output tokens, for the metrics

    # -- the worker side -------------------------------------------------------------------------
    def _run(self, kind: JobKind, payloads: list[Any]) -> list[Any]:
        results = kind.run(self.services[kind.model], payloads)
        # added, not set: a failed batch is run again a job at a time, and each success counts
        answered = [r for r in results if not isinstance(r, Exception)]  # a job's own error counts none
        self._batch.tokens = getattr(self._batch, "tokens", 0) + kind.output_tokens(answered)
        return results

    def _stepwise(self, kind: JobKind) -> Any:
        if self.settings.scheduling != "step":
            return None
        return kind.running(self.services[kind.model])

    def _on_batch(self, jobs: int, texts: int, seconds: float, step: tuple[JobKind, list] | None) -> None:
        self.metrics.batch.observe(texts)
        self.metrics.decode_seconds.inc(seconds)
        if step is not None:  # a step of a running search: the answers it finished, counted as a batch's
            kind, finished = step  # (a step per text counted its end and the beam's steps past the best)
            self._batch.tokens = kind.output_tokens(finished)
        tokens = getattr(self._batch, "tokens", 0)  # on_batch runs on the worker thread that ran it
        if tokens:
            self.metrics.tokens.inc(tokens)
            self._batch.tokens = 0

    # -- the event loop side -----------------------------------------------------------------------
    async def submit(self, kind: JobKind, payload: Any, size: int, request: Request | None = None) -> Any:
        """The job's result; 429 when the queue is full, 503 past the timeout, a freed slot when the
        client disconnects first."""
        return await self.result(self.enqueue(kind, payload, size), request)

    def enqueue(self, kind: JobKind, payload: Any, size: int) -> asyncio.Future:
        """The job queued now (its result to come), or 429 at once when the queue is full."""
        try:
            return self.batcher.enqueue(kind, payload, size, alone=kind.alone)
        except QueueFull:
            raise HTTPError(429, "Slowdown: too many requests are waiting; retry shortly",
                            {"Retry-After": "1"}) from None  # fmt: skip

    async def result(self, future: asyncio.Future, request: Request | None = None) -> Any:
        """An ``enqueue``d job's result; 503 past the timeout; the job is cancelled (skipped if it has
        not started) when the client disconnects first or the caller is cancelled (a stream whose
        client left)."""
        watch = asyncio.ensure_future(_disconnected(request)) if request is not None else None
        try:
            waiting = {future} | ({watch} if watch else set())
            done, _ = await asyncio.wait(
                waiting, timeout=self.settings.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            future.cancel()  # the batcher skips a cancelled job that has not run
            raise
        finally:
            if watch is not None:
                watch.cancel()
        if future not in done:
            future.cancel()
            if watch is not None and watch in done:
                raise HTTPError(499, "client closed the request")
            raise HTTPError(503, f"no answer within {self.settings.timeout_s:g} s (--timeout), waiting for "
                                 "the model and decoding together; retry later, or ask for less (fewer or "
                                 "shorter texts, a smaller beam or max_len)")  # fmt: skip
        try:
            return future.result()
        except AiaynError as e:  # the request's fault: 400, or the status the error names
            raise HTTPError(getattr(e, "status", 400), str(e)) from None

    # -- limits and choices that depend on the settings ------------------------------------------------
    def texts(self, q: str | list[str], per_request: bool = False) -> list[str]:
        """``q`` as a list of texts: at most ``batch_limit`` of them, each of at most ``char_limit``
        characters, or with ``per_request`` all of them together (LibreTranslate's ``/translate``
        counts so; aiayn's own routes take a batch of documents of that length each)."""
        texts, s = q if isinstance(q, list) else [q], self.settings
        if len(texts) > s.batch_limit:
            raise invalid(f"request ({len(texts)}) exceeds text limit ({s.batch_limit})")
        for chars in [sum(map(len, texts))] if per_request else map(len, texts):
            if chars > s.char_limit:
                raise invalid(f"request ({chars} characters) exceeds character limit ({s.char_limit})")
        for i, t in enumerate(texts):
            if (problem := text_problem(t)) is not None:
                raise invalid(f"q[{i}] {problem}" if isinstance(q, list) else f"q {problem}")
        return texts

    def sentences(self, texts: list[str], language: str) -> list[Sentences]:
        """Each text's lines and their sentences (``Sentences``), at most ``sentence_limit`` in all."""
        split = [Sentences(t, language) for t in texts]
        n, limit = sum(len(s.pieces) for s in split), self.settings.sentence_limit
        if n > limit:
            raise invalid(f"request ({n} sentences) exceeds sentence limit ({limit})")
        return split

    def stuck(self) -> bool:
        """Whether a request submitted now would wait past its timeout: every live worker has been on
        one batch for longer than ``timeout_s``, or no worker thread is left."""
        busy, alive = self.batcher.busy(), self.batcher.alive()
        return alive == 0 or (len(busy) >= alive and min(busy) > self.settings.timeout_s)

    def pick(self, name: str | None, cls: type, can: str | None = None) -> Any:
        """The service called ``name``, or when ``name`` is None the only one of its kind (that has
        the attribute ``can``: an encoder's ``classifier`` or ``filler``, when given)."""
        of_kind = [s for s in self.services.values() if isinstance(s, cls)]
        able = [s for s in of_kind if can is not None and getattr(s, can) is not None]
        if name is None and able:  # an encoder that cannot do it is no candidate
            of_kind = able
        if name is not None:
            service = self.services.get(name)
            if service is None or not isinstance(service, cls):
                names = ", ".join(s.name for s in of_kind) or "none"
                raise invalid(f"no {cls.kind} model named {name!r} (loaded: {names})")
        elif len(of_kind) != 1:
            names = ", ".join(s.name for s in of_kind) or "none is loaded"
            raise invalid(f"name the {cls.kind} model with 'model' ({names})")
        else:
            service = of_kind[0]
        if can is not None and getattr(service, can) is None:  # refused here, not after the queue
            raise invalid(service.unable(can))
        return service

    def search_config(self, given: dict[str, Any] | None = None, **defaults: Any) -> SearchConfig:
        """The decoding options a request ``given`` over the route's ``defaults``, each within its
        bound (``BOUNDS``); the default length, input + max_len_b, within --max-len too."""
        asked = {**defaults, **(given or {})}
        self._check_bounds(asked)  # first: the limit's own words, not SearchConfig's for max_len_cap
        try:
            config = SearchConfig(**{**asked, "max_len_cap": self.settings.max_len})
        except (AiaynError, TypeError) as e:
            raise invalid(str(e)) from None
        self._check_bounds(vars(config))  # SearchConfig's defaults too (a --max-beam below its beam)
        return config

    def _check_bounds(self, options: dict[str, Any]) -> None:
        for option, setting in BOUNDS.items():
            value, limit = options.get(option), getattr(self.settings, setting)
            if isinstance(value, int) and value > limit:
                raise invalid(
                    f"{option}={value} is over this server's limit of {limit} (--{setting.replace('_', '-')})"
                )


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone: the ASGI server's ``http.disconnect`` message, awaited
    (the body is read already, so nothing else arrives), not polled: polling every request in flight
    cost the event loop more CPU than the requests themselves under load (docs/serve.md, Load)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)  # anything else (a pipelined request's bytes): look again later
