"""What an operator watches: ``/health`` (the page also builds its controls from it) and ``/metrics``
(Prometheus text: requests by route and status, latency, texts per batch, queue depth, tokens/s)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from aiayn.serve.dependencies import ServerDep
from aiayn.serve.schemas import Health, ModelInfo
from aiayn.serve.services import EncoderService, TranslationService
from aiayn.version import __version__

router = APIRouter(tags=["operations"])


@router.get("/health", response_model=Health, response_model_exclude_none=True)
async def health(server: ServerDep) -> Health:
    """The server's version, its queue depth and the models it serves."""
    models = [describe(s) for s in server.services.values()]
    return Health(status="ok", version=__version__, queue=server.batcher.depth(), models=models)


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
