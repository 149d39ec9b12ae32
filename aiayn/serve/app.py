"""The HTTP application: LibreTranslate's API, the native ``/v1`` API, health, metrics, the page.

FastAPI's "bigger applications" layout: ``create_app`` puts a ``Server`` (``server.py``: the models,
the batcher, the settings) on ``app.state`` and includes one router per API (``routers/``); the
checks the routes share are dependencies (``dependencies.py``), the bodies and answers Pydantic
models (``schemas.py``). Every error is JSON ``{"error": "..."}`` with LibreTranslate's statuses
(400 a bad request, 403 a missing or wrong API key, 404 an unknown path, 405 a method a path does not
take, 408 a body that arrived too slowly, 413 a body or an answer over the limit, 429 a full queue,
with ``Retry-After``, 503 a request that waited past the timeout or that a forced exit cut short,
500 a failure of the model) and the server keeps serving: the handlers below turn every kind of
error FastAPI, Starlette and the library raise into that shape, once. ``HEAD`` is answered for
every ``GET`` route (``HeadAsGet``). One log line per request (method, path, status, milliseconds;
never the body).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from aiayn.errors import AiaynError
from aiayn.serve.connections import CUT_OFF, LEFT
from aiayn.serve.routers import libretranslate, operations, page, v1
from aiayn.serve.server import HTTPError, Server
from aiayn.serve.settings import Settings
from aiayn.version import __version__

log = logging.getLogger("aiayn.serve")
ASKED = "aiayn.asked_method"  # the scope key HeadAsGet leaves: the method the client sent (HEAD)
ROUTERS = (libretranslate.router, v1.router, operations.router, page.router)
# the paths /metrics counts by name (any other is "other"): every route but the templated one, whose
# few real paths are listed instead
ROUTES = {r.path for router in ROUTERS for r in router.routes if "{" not in r.path} | {
    f"/static/{name}" for name in page.ASSETS
}


def create_app(services: list, settings: Settings | None = None, threads: int = 0) -> FastAPI:
    """The FastAPI application serving ``services`` (see ``services.load_service``), its worker
    threads each on ``threads`` PyTorch CPU threads (0: PyTorch's default)."""
    server = Server(services, settings or Settings(), threads)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            yield
        except asyncio.CancelledError:  # a forced exit (a second Ctrl-C) cancels the lifespan too: an
            return  # exit as designed, not a failure for Starlette to log as a traceback (cli/serve.py
            # then stops the workers at their next step)
        server.batcher.close()

    app = FastAPI(
        title="aiayn", version=__version__, description="The Transformer, served.", lifespan=lifespan
    )
    app.state.server = server
    for router in ROUTERS:
        app.include_router(router)

    @app.exception_handler(HTTPError)
    async def _error(request: Request, e: HTTPError) -> JSONResponse:
        return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)  # routing's 404 and 405, in the same shape
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(e.detail)}, status_code=e.status_code, headers=e.headers)

    @app.exception_handler(RequestValidationError)  # a path or query parameter of the wrong type
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"error": f"Invalid request: {where}: {first.get('msg')}"}, status_code=400)

    @app.exception_handler(AiaynError)  # the library refused the request's input
    async def _refused(request: Request, e: AiaynError) -> JSONResponse:
        return JSONResponse({"error": f"Invalid request: {e}"}, status_code=getattr(e, "status", 400))

    if server.settings.cors_origins:  # inside Observe: a preflight is logged, counted and origin-checked
        app.add_middleware(CORSMiddleware, allow_origins=sorted(server.settings.cors_origins),
                           allow_methods=["GET", "HEAD", "POST"], allow_headers=["Content-Type", "X-API-Key"],
                           max_age=600)  # fmt: skip
    app.add_middleware(Observe, server=server)
    app.add_middleware(HeadAsGet)
    return app


class Observe:
    """One log line and the request metrics (count by route and status, latency) per request, a
    failure of the application (a bug) logged and answered 500 as JSON, and a request that a forced
    exit (a second Ctrl-C) cut short answered 503 as JSON (not uvicorn's plain-text 500).

    A plain ASGI middleware that watches the response's start for its status: Starlette's
    ``BaseHTTPMiddleware`` (``@app.middleware("http")``) runs each request through memory streams and
    task groups, CPU that the event loop shares with the model under load. Latency is counted to the
    response's last byte (a streamed generation included)."""

    def __init__(self, app, server: Server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), None

        async def send_watched(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        path = scope["path"]  # decoded: a %0a would start a forged log line, a %00 make the log binary
        shown = path if path.isprintable() else path.encode("unicode_escape").decode("ascii")
        try:
            refusal = self._refused_host(scope) or self._refused_origin(scope)
            await (self.app if refusal is None else refusal)(scope, receive, send_watched)
        except Exception:  # a bug: logged, and answered 500 as JSON unless the answer had begun
            log.exception("%s %s failed", scope.get(ASKED, scope["method"]), shown)
            if status is None:
                await JSONResponse({"error": "internal error: the server failed on this request"}, 500)(
                    scope, receive, send_watched
                )
        except asyncio.CancelledError:  # a forced exit (a second Ctrl-C) ends every request's task
            if status is not None:
                raise  # an answer already begun (a stream): uvicorn closes its connection
            answer = {"error": "the server is shutting down; retry later"}
            await JSONResponse(answer, 503, {"Connection": "close"})(scope, receive, send_watched)
        seconds = time.perf_counter() - t0
        route = path if path in ROUTES else "other"
        outcome = "cut off" if scope.get(CUT_OFF) else "499" if scope.get(LEFT) else str(status)
        self.server.metrics.requests.labels(route, outcome).inc()
        self.server.metrics.latency.labels(route).observe(seconds)
        log.info("%s %s %s %.1f ms", scope.get(ASKED, scope["method"]), shown, outcome, 1000 * seconds)

    def _refused_host(self, scope) -> JSONResponse | None:
        """400 for a Host header outside ``--allowed-hosts`` (a browser's request after DNS rebinding
        names the attacker's host); None to go on (no header: not a browser's)."""
        allowed = self.server.settings.allowed_hosts
        raw = dict(scope["headers"]).get(b"host")
        if not allowed or raw is None:
            return None
        host = raw.decode("latin-1").strip().lower()
        name = host[1 : host.find("]")] if host.startswith("[") else host.rpartition(":")[0] or host
        if name in allowed:
            return None
        shown = ascii(host)[1:-1]
        return JSONResponse({"error": f"Host {shown!r} is not one this server answers to (it answers "
                                      f"{', '.join(sorted(allowed))}); to serve it, pass --allowed-hosts "
                                      "with its name (or '*')"}, 400)  # fmt: skip

    def _refused_origin(self, scope) -> JSONResponse | None:
        """403 for a browser's POST sent by a page of another site to a server that answers only its
        own names (the loopback default): a form or a no-cors fetch needs no CORS permission to be
        *sent*, and would spend this server's CPU (cross-site request forgery). Answered: reading
        (GET, HEAD: opening the page from a link costs nothing), clients that are not browsers (no
        ``Origin``, no ``Sec-Fetch-Site``), a page of one of the server's names (any port), and what
        the browser itself calls ``same-origin``, ``same-site`` or ``none`` (the page behind a reverse
        proxy that rewrites Host; browsers without the header then need ``--allowed-hosts``), and the
        sites ``--cors-origins`` names (or all, with ``*``), whose pages may read the answers too."""
        allowed, cors = self.server.settings.allowed_hosts, self.server.settings.cors_origins
        if not allowed or scope["method"] in ("GET", "HEAD") or "*" in cors:
            return None
        headers = dict(scope["headers"])
        origin = headers.get(b"origin", b"").decode("latin-1").strip().lower()
        if origin in cors:  # a site the operator lets read the answers (--cors-origins) may send them
            return None
        site = headers.get(b"sec-fetch-site", b"").decode("latin-1").strip().lower()
        try:
            host = urllib.parse.urlsplit(origin).hostname if origin not in ("", "null") else None
        except ValueError:  # "http://[zz": no site a browser sends, so none of the server's names
            host = None
        if host in allowed or site in ("same-origin", "same-site", "none") or not (origin or site):
            return None
        shown = ascii(origin or "another site")[1:-1]
        names = ", ".join(sorted(allowed))
        return JSONResponse({"error": f"a request from {shown!r} is refused: this server answers pages of "
                                      f"{names} only; to serve others, pass --allowed-hosts with their "
                                      "name (or '*')"}, 403)  # fmt: skip


class HeadAsGet:
    """``HEAD`` on any path is its ``GET`` without the body (HTTP's rule, which FastAPI's routes do
    not apply themselves): the status and headers a ``GET`` would have."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def send_head(message):
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET", ASKED: "HEAD"}, receive, send_head)  # logged as asked
