"""What an operator watches: ``/health`` (the page also builds its controls from it; 503 with status
``stuck`` when every worker has been on one batch longer than ``--timeout``) and ``/metrics``
(Prometheus text: requests by route and status, latency, texts per batch, queue depth, tokens/s)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from aiayn.serve.dependencies import ServerDep
from aiayn.serve.schemas import Health, Limits, ModelInfo
from aiayn.serve.services import EncoderService, TranslationService
from aiayn.version import __version__

router = APIRouter(tags=["operations"])


STUCK = {503: {"model": Health, "description": "stuck: no worker can take new work"}}


@router.get("/health", response_model=Health, response_model_exclude_none=True, responses=STUCK)
async def health(server: ServerDep, response: Response) -> Health:
    """The server's version, its queue depth, how long its workers have been on their batches and
    the models it serves; 503 (status ``stuck``) when every worker has been on one batch longer than
    ``--timeout``, or none is left, so that a request sent now would time out."""
    models = [describe(s) for s in server.services.values()]
    stuck = server.stuck()
    if stuck:
        response.status_code = 503
    busy = [round(seconds, 3) for seconds in server.batcher.busy()]
    limits = Limits(**{name: getattr(server.settings, name) for name in Limits.model_fields})
    return Health(status="stuck" if stuck else "ok", version=__version__, queue=server.batcher.depth(),
                  busy_s=busy, models=models, limits=limits)  # fmt: skip


@router.get("/metrics", response_class=Response)
async def metrics(server: ServerDep) -> Response:
    return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def describe(service) -> ModelInfo:
    """A model as /health lists it."""
    info = ModelInfo(name=service.name, kind=service.kind)
    if isinstance(service, TranslationService):
        info.source, info.target = service.source, service.target
    if isinstance(service, EncoderService):
        info.classify, info.fill_mask = service.classifier is not None, service.filler is not None
    return info
