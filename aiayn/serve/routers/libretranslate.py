"""LibreTranslate's API: existing LibreTranslate clients work unchanged.

``/translate`` decodes with beam 4 (or ``alternatives + 1``) and answers with LibreTranslate's field
names; it translates each text sentence by sentence, as LibreTranslate does (``Sentences``), and with
``format=html`` the texts between the tags (``HtmlText``). ``/languages`` lists each loaded language
with the targets it translates into (none for a language that is only a target), so that a client's
target list holds every target too. aiayn has no
language detector: ``source=auto`` (and ``/detect``) names the one source language that can be meant,
and is refused (400) where several loaded models could be.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from aiayn.serve.dependencies import ServerDep, parse
from aiayn.serve.html_text import HtmlText
from aiayn.serve.jobs import Translation
from aiayn.serve.schemas import (
    ERRORS,
    DetectedLanguage,
    DetectRequest,
    Language,
    TranslateRequest,
    TranslateResponse,
    request_body,
)
from aiayn.serve.sentences import joined_texts, pieces_of
from aiayn.serve.server import HTTPError, Server, invalid
from aiayn.serve.services import TranslationService, language_name

router = APIRouter(tags=["LibreTranslate"])


@router.get("/languages", response_model=list[Language])
async def languages(server: ServerDep) -> list[Language]:
    """Each language with the targets it translates into (none: only a target)."""
    targets: dict[str, set[str]] = {}
    for s in _translators(server):
        targets.setdefault(s.source, set()).add(s.target)
        targets.setdefault(s.target, set())
    return [Language(code=c, name=language_name(c), targets=sorted(t)) for c, t in sorted(targets.items())]


@router.post("/detect", response_model=list[DetectedLanguage], responses=ERRORS,
             openapi_extra=request_body(DetectRequest, form=True))  # fmt: skip
async def detect(
    body: Annotated[DetectRequest, Depends(parse(DetectRequest))], server: ServerDep
) -> list[DetectedLanguage]:
    """The language of ``q``: without a detector, the one source language the loaded models read
    (400 where they read several)."""
    if not body.q:
        raise invalid("missing q parameter")
    sources = sorted({s.source for s in _translators(server)})
    if len(sources) != 1:
        raise invalid(f"no language detection here: the models read {', '.join(sources) or 'nothing'}; "
                      "give source")  # fmt: skip
    return [DetectedLanguage(confidence=100.0, language=sources[0])]


@router.post(
    "/translate",
    response_model=TranslateResponse,
    response_model_exclude_none=True,
    responses=ERRORS,
    openapi_extra=request_body(TranslateRequest, form=True),
)
async def translate(
    request: Request, body: Annotated[TranslateRequest, Depends(parse(TranslateRequest))], server: ServerDep
) -> TranslateResponse:
    """Translate ``q`` (a string or a list) from ``source`` (or ``auto``) into ``target``, with up to
    ``alternatives`` other translations of each text; JSON or form-encoded."""
    if not body.q:  # "" or []: LibreTranslate's own answer
        raise invalid("missing q parameter")
    many, texts = isinstance(body.q, list), server.texts(body.q, per_request=True)  # as LibreTranslate
    service = _by_languages(server, body.source, body.target)
    alternatives = max(0, body.alternatives)  # LibreTranslate's reading of a negative number
    if alternatives >= server.settings.max_beam:
        raise invalid(f"alternatives must be in 0..{server.settings.max_beam - 1}")
    if body.format == "html":
        best, others = await _translate_html(server, service, texts, request)
    else:
        n = alternatives + 1
        config = server.search_config(beam=min(max(4, n), server.settings.max_beam), nbest=n)
        best, others = await _translate_sentences(server, service, config, texts, request)
    detected = DetectedLanguage(confidence=100.0, language=service.source)
    return TranslateResponse(
        translatedText=best if many else best[0],
        alternatives=(others if many else others[0]) if alternatives else None,
        detectedLanguage=([detected] * len(texts) if many else detected) if body.source == "auto" else None,
    )


async def _submit(server: Server, service: TranslationService, config, texts: list[str], request: Request):
    sources, _ = service.encode(texts)  # a text the tokenizer refuses fails here, not in a batch; a text
    # cut to the tokens the model reads is translated in part (LibreTranslate's answer has no field to say it)
    return await server.submit(Translation(service.name, config, False), sources, len(texts), request)


async def _translate_sentences(
    server: Server, service: TranslationService, config, texts: list[str], request: Request
) -> tuple[list[str], list[list[str]]]:
    """Each text translated sentence by sentence (``Sentences``: its lines, then their sentences), all
    as one batch; its alternatives join the sentences' second, third, … hypotheses as the best are
    joined (Argos Translate's)."""
    split = server.sentences(texts, service.source)
    pieces = pieces_of(split)
    results = await _submit(server, service, config, pieces, request) if pieces else []
    joined = joined_texts(split, results, config.nbest)
    return [j["translation"] for j in joined], [[h["text"] for h in j["hypotheses"][1:]] for j in joined]


async def _translate_html(
    server: Server, service: TranslationService, texts: list[str], request: Request
) -> tuple[list[str], list[list[str]]]:
    """Each markup text with its texts between tags translated (``HtmlText``), as one batch; no
    alternatives (LibreTranslate gives none for HTML)."""
    pages = await run_in_threadpool(lambda: [HtmlText(t) for t in texts])  # parsing may take seconds
    pieces = [piece for page in pages for piece in page.texts]  # bounded by --sentence-limit, as sentences
    config = server.search_config(beam=min(4, server.settings.max_beam))
    translations, _ = await _translate_sentences(server, service, config, pieces, request)
    best, start = [], 0
    for page in pages:
        best.append(page.join(translations[start : start + len(page.texts)]))
        start += len(page.texts)
    return best, [[] for _ in pages]


def _translators(server: Server) -> list[TranslationService]:
    return [s for s in server.services.values() if isinstance(s, TranslationService)]


def _by_languages(server: Server, source: str, target: str) -> TranslationService:
    """The first translation model from ``source`` into ``target``; with ``source=auto``, the one
    source language that translates into ``target`` (400 if several do: aiayn detects none)."""
    models = [s for s in _translators(server) if s.target == target]
    if source != "auto":
        models = [s for s in models if s.source == source]
    if not models:
        raise HTTPError(400, f"{source} → {target} is not available: see /languages")
    sources = sorted({s.source for s in models})
    if len(sources) > 1:
        raise invalid(f"source=auto: {', '.join(sources)} all translate into {target}, and this server "
                      "detects no language; give source")  # fmt: skip
    return models[0]
