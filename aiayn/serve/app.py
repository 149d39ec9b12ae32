"""The HTTP application: LibreTranslate's API, the native ``/v1`` API, health, metrics, the page.

FastAPI's "bigger applications" layout: ``create_app`` puts a ``Server`` (``server.py``: the models,
the batcher, the settings) on ``app.state`` and includes one router per API (``routers/``); the
checks the routes share are dependencies (``dependencies.py``), the bodies and answers Pydantic
models (``schemas.py``). Every error is JSON ``{"error": "..."}`` with LibreTranslate's statuses
(400 a bad request, 403 a missing or wrong API key, 413 a body over the limit, 429 a full queue,
with ``Retry-After``, 503 a request that waited past the timeout, 500 a failure of the model) and
the server keeps serving. One log line per request (method, path, status, milliseconds; never the body).
"""

from __future__ import annotations

import contextlib
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from aiayn.serve.routers import libretranslate, operations, page, v1
from aiayn.serve.server import HTTPError, Server
from aiayn.serve.settings import Settings
from aiayn.version import __version__

log = logging.getLogger("aiayn.serve")
ROUTERS = (libretranslate.router, v1.router, operations.router, page.router)
# the paths /metrics counts by name (any other is "other"): every route but the templated one, whose
# few real paths are listed instead
ROUTES = {r.path for router in ROUTERS for r in router.routes if "{" not in r.path} | {
    f"/static/{name}" for name in page.ASSETS
}


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
    for router in ROUTERS:
        app.include_router(router)

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

    return app
