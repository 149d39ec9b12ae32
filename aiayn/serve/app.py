"""The HTTP application: LibreTranslate's API, the native ``/v1`` API, health, metrics, the page.

Every error is JSON ``{"error": "..."}`` with LibreTranslate's statuses (400 a bad request, 403 a
missing or wrong API key, 413 a body over the limit, 429 a full queue, with ``Retry-After``, 503 a
request that waited past the timeout, 500 a failure of the model) and the server keeps serving.
Bodies are read up to ``max_body_bytes`` and no further; texts are checked against ``char_limit``
and ``batch_limit`` before they reach the queue. One log line per request (method, path, status,
milliseconds; never the body).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Hashable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from aiayn.decoding.options import SearchConfig
from aiayn.errors import AiaynError
from aiayn.serve.batcher import Batcher, QueueFull
from aiayn.serve.services import EncoderService, LMService, TranslationService, language_name
from aiayn.serve.settings import Settings
from aiayn.version import __version__

log = logging.getLogger("aiayn.serve")
SEARCH_FIELDS = ("beam", "nbest", "lenpen", "max_len", "min_len", "sample", "temperature", "top_k", "top_p",
                 "seed", "r2l_beam", "mbr")  # fmt: skip


class HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class Metrics:
    """Prometheus metrics of one app (its own registry, so that several apps can live in a process)."""

    def __init__(self, depth):
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "aiayn_requests", "Requests by route and status", ["route", "status"], registry=r
        )
        seconds = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
        self.latency = Histogram(
            "aiayn_request_seconds", "Request latency", ["route"], registry=r, buckets=seconds
        )
        self.batch = Histogram("aiayn_batch_texts", "Texts decoded together per batch", registry=r,
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128))  # fmt: skip
        self.tokens = Counter("aiayn_output_tokens", "Output tokens produced", registry=r)
        self.tokens_per_s = Gauge(
            "aiayn_tokens_per_second", "Output tokens per second, last batch", registry=r
        )
        Gauge("aiayn_queue_depth", "Requests waiting for the model", registry=r).set_function(depth)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise HTTPError(400, f"Invalid request: {what} must be a string")
    return value


class Server:
    """The models, the batcher and the settings behind the routes."""

    def __init__(self, services: list, settings: Settings):
        if not services:
            raise AiaynError("give at least one --model")
        self.services, self.settings = {s.name: s for s in services}, settings
        self.metrics = Metrics(lambda: self.batcher.depth())
        self.batcher = Batcher(self._run, settings.queue_size, settings.batch_window_ms / 1000,
                               settings.max_batch_texts, self._on_batch, settings.workers)  # fmt: skip
        self._batch = threading.local()  # each worker's last batch: target tokens, for the metrics

    # -- the worker side -------------------------------------------------------------------------
    def _run(self, key: Hashable, payloads: list[Any]) -> list[Any]:
        what, name = key[0], key[1]
        service = self.services[name]
        if what == "translate":
            results = service.run(key[2], payloads, key[3])
            best = (x["hypotheses"][:1] for r in results for x in r)
            self._batch.tokens = sum(len(h["tokens"]) for hyps in best for h in hyps)
            return results
        if what == "classify":
            return service.classify(payloads, key[2])
        if what == "fill":
            return [service.fill(q, key[2]) for q in payloads]
        if what == "generate":
            ((prompt, max_new, config, emit),) = payloads
            text = service.stream(prompt, max_new, config, emit)
            return [text]
        raise ValueError(f"unknown job {what!r}")

    def _on_batch(self, jobs: int, texts: int, seconds: float) -> None:
        self.metrics.batch.observe(texts)
        tokens = getattr(self._batch, "tokens", 0)  # on_batch runs on the worker thread that ran it
        if tokens:
            self.metrics.tokens.inc(tokens)
            self.metrics.tokens_per_s.set(tokens / max(seconds, 1e-9))
            self._batch.tokens = 0

    async def submit(self, key: Hashable, payload: Any, size: int, request: Request | None = None) -> Any:
        """The job's result; 429 when the queue is full, 503 past the timeout, a freed slot when the
        client disconnects first."""
        task = asyncio.ensure_future(self.batcher.submit(key, payload, size))  # a full queue fails it at once
        watch = asyncio.ensure_future(_disconnected(request)) if request is not None else None
        try:
            waiting = {task} | ({watch} if watch else set())
            done, _ = await asyncio.wait(
                waiting, timeout=self.settings.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if watch is not None:
                watch.cancel()
        if task not in done:
            task.cancel()  # the batcher skips a cancelled job that has not run
            if watch is not None and watch in done:
                raise HTTPError(499, "client closed the request")
            raise HTTPError(503, f"the request waited more than {self.settings.timeout_s:g} s; retry later")
        try:
            return task.result()
        except QueueFull:
            raise HTTPError(429, "Slowdown: too many requests are waiting; retry shortly",
                            {"Retry-After": "1"}) from None  # fmt: skip
        except AiaynError as e:
            raise HTTPError(400, str(e)) from None

    # -- request parsing -----------------------------------------------------------------------------
    async def body(self, request: Request) -> dict:
        """The JSON or form-encoded body as a dict, read up to ``max_body_bytes``."""
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, f"the body is over {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"the body is over {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise HTTPError(
                400, f"Invalid request: the body is not UTF-8 ({e.reason} at byte {e.start})"
            ) from None
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind == "application/x-www-form-urlencoded" or (
            not kind and "=" in text and not text.startswith("{")
        ):
            form = parse_qs(text, keep_blank_values=True)
            return {k: v if k == "q" and len(v) > 1 else v[-1] for k, v in form.items()}
        if kind not in ("application/json", ""):
            raise HTTPError(415, f"content type {kind!r} is not JSON or form-encoded")
        if not text.strip():
            return {}
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise HTTPError(400, f"Invalid request: malformed JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, dict):
            raise HTTPError(400, "Invalid request: the body must be a JSON object")
        return data

    def check_key(self, request: Request, data: dict) -> None:
        keys = self.settings.api_keys
        if keys and (data.get("api_key") or request.headers.get("x-api-key")) not in keys:
            raise HTTPError(403, "Invalid API key")

    def texts(self, data: dict) -> tuple[list[str], bool]:
        """``q`` as a list of texts, and whether it was a list; checked against the limits."""
        if "q" not in data:
            raise HTTPError(400, "Invalid request: missing q parameter")
        q, many = data["q"], isinstance(data["q"], list)
        texts = [_text(t, "each q") for t in q] if many else [_text(q, "q")]
        s = self.settings
        if len(texts) > s.batch_limit:
            raise HTTPError(
                400, f"Invalid request: request ({len(texts)}) exceeds text limit ({s.batch_limit})"
            )
        for t in texts:
            if len(t) > s.char_limit:
                raise HTTPError(
                    400, f"Invalid request: request ({len(t)}) exceeds character limit ({s.char_limit})"
                )
        return texts, many

    def pick(self, data: dict, cls: type) -> Any:
        """The service ``data["model"]`` names, or the only one of its kind."""
        of_kind = [s for s in self.services.values() if isinstance(s, cls)]
        name = data.get("model")
        if name is not None:
            service = self.services.get(name) if isinstance(name, str) else None
            if service is None or not isinstance(service, cls):
                names = ", ".join(s.name for s in of_kind) or "none"
                raise HTTPError(400, f"Invalid request: no {cls.kind} model named {name!r} (loaded: {names})")
            return service
        if len(of_kind) != 1:
            names = ", ".join(s.name for s in of_kind) or "none is loaded"
            raise HTTPError(400, f"Invalid request: name the {cls.kind} model with 'model' ({names})")
        return of_kind[0]

    def search_config(self, data: dict, **defaults) -> SearchConfig:
        options = {**defaults, **{k: data[k] for k in SEARCH_FIELDS if k in data}}
        try:
            config = SearchConfig(**options)
        except (AiaynError, TypeError) as e:
            raise HTTPError(400, f"Invalid request: {e}") from None
        if config.beam > self.settings.max_beam or (config.r2l_beam or 0) > self.settings.max_beam:
            raise HTTPError(400, f"Invalid request: beam {config.beam} is over this server's limit of "
                                 f"{self.settings.max_beam}")  # fmt: skip
        return config


async def _disconnected(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.05)


def create_app(services: list, settings: Settings | None = None) -> FastAPI:
    """The FastAPI application serving ``services`` (see ``services.load_service``)."""
    server = Server(services, settings or Settings())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        server.batcher.close()

    app = FastAPI(
        title="aiayn", version=__version__, description="The Transformer, served.", lifespan=lifespan
    )
    app.state.server = server

    @app.exception_handler(HTTPError)
    async def _error(request: Request, e: HTTPError) -> JSONResponse:
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)

    @app.middleware("http")
    async def _observe(request: Request, call_next):
        t0 = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception:  # a bug: logged, and answered 500 as JSON
            log.exception("%s %s failed", request.method, request.url.path)
            response = JSONResponse({"error": "internal error: the server failed on this request"}, 500)
        route = request.url.path if request.url.path in ROUTES else "other"
        seconds = time.perf_counter() - t0
        server.metrics.requests.labels(route, str(response.status_code)).inc()
        server.metrics.latency.labels(route).observe(seconds)
        log.info("%s %s %d %.1f ms", request.method, request.url.path, response.status_code, 1000 * seconds)
        return response

    # -- LibreTranslate ---------------------------------------------------------------------------------
    @app.get("/languages")
    async def languages() -> list[dict]:
        """LibreTranslate's language list: each source with the targets it translates into."""
        targets: dict[str, list[str]] = {}
        for s in server.services.values():
            if isinstance(s, TranslationService):
                targets.setdefault(s.source, []).append(s.target)
        return [
            {"code": c, "name": language_name(c), "targets": sorted(set(t))}
            for c, t in sorted(targets.items())
        ]

    @app.post("/translate")
    async def translate(request: Request) -> JSONResponse:
        """LibreTranslate's ``/translate``: ``q`` (a string or a list), ``source``, ``target``,
        ``format`` ("text"), ``alternatives``, ``api_key``; JSON or form-encoded."""
        data = await server.body(request)
        server.check_key(request, data)
        texts, many = server.texts(data)
        source, target = data.get("source", "auto"), data.get("target")
        if not isinstance(target, str) or not target:
            raise HTTPError(400, "Invalid request: missing target parameter")
        fmt = data.get("format", "text")
        if fmt not in ("text", "html"):
            raise HTTPError(400, f"Invalid request: format {fmt!r} is not text or html")
        service = _by_languages(server, source, target)
        try:
            alternatives = int(data.get("alternatives", 0))
        except (TypeError, ValueError):
            raise HTTPError(400, "Invalid request: alternatives must be an integer") from None
        if not 0 <= alternatives < server.settings.max_beam:
            raise HTTPError(
                400, f"Invalid request: alternatives must be in 0..{server.settings.max_beam - 1}"
            )
        beam = max(4, alternatives + 1)
        config = server.search_config({}, beam=beam, nbest=alternatives + 1)
        results = await server.submit(("translate", service.name, config, False), texts, len(texts), request)

        def one(r: dict) -> tuple[str, list[str]]:
            return r["translation"], [h["text"] for h in r["hypotheses"][1:]]

        pairs = [one(r) for r in results]
        body: dict[str, Any] = {"translatedText": [p[0] for p in pairs] if many else pairs[0][0]}
        if alternatives:
            body["alternatives"] = [p[1] for p in pairs] if many else pairs[0][1]
        if source == "auto":
            detected = {"confidence": 100.0, "language": service.source}
            body["detectedLanguage"] = [detected] * len(pairs) if many else detected
        return JSONResponse(body)

    # -- native -------------------------------------------------------------------------------------
    @app.post("/v1/translate")
    async def translate_v1(request: Request) -> JSONResponse:
        """Translate with every decoding option of ``aiayn translate`` (``beam``, ``nbest``,
        ``lenpen``, ``max_len``, ``min_len``, ``sample``, ``temperature``, ``top_k``, ``top_p``,
        ``seed``, ``r2l_beam``, ``mbr``); ``attention: true`` adds every layer's and head's weights."""
        data = await server.body(request)
        server.check_key(request, data)
        texts, _ = server.texts(data)
        service = server.pick(data, TranslationService)
        config = server.search_config(data)
        attention = data.get("attention", False)
        if not isinstance(attention, bool):
            raise HTTPError(400, "Invalid request: attention must be true or false")
        results = await server.submit(
            ("translate", service.name, config, attention), texts, len(texts), request
        )
        return JSONResponse({"model": service.name, "source": service.source, "target": service.target,
                             "results": results})  # fmt: skip

    @app.post("/v1/generate")
    async def generate(request: Request) -> Response:
        """Continue ``prompt`` with a language model; ``stream: true`` sends each piece of text as a
        server-sent event (``data: {"text": …}``), then ``data: {"done": true, "text": …}``."""
        data = await server.body(request)
        server.check_key(request, data)
        service = server.pick(data, LMService)
        prompt = _text(data.get("prompt", "\n"), "prompt")
        if len(prompt) > server.settings.char_limit:
            raise HTTPError(
                400, f"Invalid request: prompt exceeds character limit ({server.settings.char_limit})"
            )
        max_new = data.get("max_new_tokens", 100)
        if (
            not isinstance(max_new, int)
            or isinstance(max_new, bool)
            or not 1 <= max_new <= server.settings.max_new_tokens
        ):
            raise HTTPError(
                400, f"Invalid request: max_new_tokens must be in 1..{server.settings.max_new_tokens}"
            )
        config = server.search_config(data, beam=1, sample=not data.get("greedy", False))
        if not data.get("stream", False):
            job = (prompt, max_new, config, lambda _: True)
            out = await server.submit(("generate", service.name, object()), job, 1, request)
            return JSONResponse({"model": service.name, "prompt": prompt, "text": out})
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        alive = {"yes": True}

        def emit(piece: str) -> bool:
            loop.call_soon_threadsafe(events.put_nowait, {"text": piece})
            return alive["yes"]

        job = asyncio.ensure_future(server.submit(("generate", service.name, object()),
                                                  (prompt, max_new, config, emit), 1))  # fmt: skip

        async def stream():
            try:
                while True:
                    getter = asyncio.ensure_future(events.get())
                    done, _ = await asyncio.wait({getter, job}, return_when=asyncio.FIRST_COMPLETED)
                    if getter in done:
                        yield f"data: {json.dumps(getter.result(), ensure_ascii=False)}\n\n"
                        continue
                    getter.cancel()
                    while not events.empty():
                        yield f"data: {json.dumps(events.get_nowait(), ensure_ascii=False)}\n\n"
                    try:
                        text = job.result()
                        yield f"data: {json.dumps({'done': True, 'text': text}, ensure_ascii=False)}\n\n"
                    except HTTPError as e:
                        yield f"data: {json.dumps({'error': e.message})}\n\n"
                    return
            finally:
                alive["yes"] = False  # the client left, or the stream ended: stop sampling

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/classify")
    async def classify(request: Request) -> JSONResponse:
        """Label ``q`` (a string or a list) with a classifier; ``top_k`` labels each."""
        data = await server.body(request)
        server.check_key(request, data)
        texts, many = server.texts(data)
        service = server.pick(data, EncoderService)
        top_k = _int(data.get("top_k", 1), "top_k", 1, 100)
        results = await server.submit(("classify", service.name, top_k), texts, len(texts), request)
        return JSONResponse({"model": service.name, "results": results if many else results[0]})

    @app.post("/v1/fill-mask")
    async def fill_mask(request: Request) -> JSONResponse:
        """The ``top_k`` pieces at each ``<mask>`` of ``q``."""
        data = await server.body(request)
        server.check_key(request, data)
        texts, _ = server.texts(data)
        if len(texts) != 1:
            raise HTTPError(400, "Invalid request: fill-mask takes one q")
        service = server.pick(data, EncoderService)
        top_k = _int(data.get("top_k", 5), "top_k", 1, 100)
        masks = await server.submit(("fill", service.name, top_k), texts[0], 1, request)
        return JSONResponse({"model": service.name, "masks": masks})

    # -- operations -----------------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "version": __version__, "queue": server.batcher.depth(),
                "models": [_describe(s) for s in server.services.values()]}  # fmt: skip

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    static = resources.files("aiayn.serve").joinpath("static")

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(static.joinpath("index.html").read_text("utf-8"))

    @app.get("/static/{name}")
    async def asset(name: str) -> Response:
        kinds = {"app.js": "text/javascript", "style.css": "text/css"}
        if name not in kinds:  # a fixed list: no path ever reaches the file system
            raise HTTPError(404, f"no such file: {name}")
        return Response(static.joinpath(name).read_text("utf-8"), media_type=kinds[name])

    return app


ROUTES = {"/translate", "/languages", "/v1/translate", "/v1/generate", "/v1/classify", "/v1/fill-mask",
          "/health", "/metrics", "/", "/static/app.js", "/static/style.css"}  # fmt: skip


def _describe(service) -> dict:
    """A model as /health lists it (the page builds its controls from this)."""
    out = {"name": service.name, "kind": service.kind}
    if isinstance(service, TranslationService):
        out.update(source=service.source, target=service.target)
    if isinstance(service, EncoderService):
        out.update(classify=service.classifier is not None, fill_mask=service.filler is not None)
    return out


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise HTTPError(400, f"Invalid request: {name} must be an integer in {lo}..{hi}")
    return value


def _by_languages(server: Server, source: Any, target: str) -> TranslationService:
    models = [s for s in server.services.values() if isinstance(s, TranslationService) and s.target == target]
    if source != "auto":
        models = [s for s in models if s.source == source]
    if not models:
        raise HTTPError(400, f"{source} → {target} is not available: see /languages")
    return models[0]
