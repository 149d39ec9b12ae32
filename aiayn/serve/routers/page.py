"""The page at ``/``: a translator with an attention explorer and a language-model playground. It is
three files in the package (``aiayn/serve/static/``), served from a fixed list, with no CDN."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from aiayn.serve.server import HTTPError

ASSETS = {"app.js": "text/javascript", "style.css": "text/css"}  # no other path reaches the file system
STATIC = resources.files("aiayn.serve").joinpath("static")

router = APIRouter(tags=["page"])


@router.get("/", response_class=HTMLResponse)
async def page() -> HTMLResponse:
    return HTMLResponse(STATIC.joinpath("index.html").read_text("utf-8"))


@router.get("/static/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise HTTPError(404, f"no such file: {name}")
    return Response(STATIC.joinpath(name).read_text("utf-8"), media_type=ASSETS[name])
