"""The native API under ``/v1``: every decoding option, language models, encoders.

``/v1/translate`` takes every option of ``aiayn translate`` and can add the attention weights the
page draws; ``/v1/generate`` continues a prompt, whole or as server-sent events; ``/v1/classify``
labels texts and ``/v1/fill-mask`` fills ``<mask>``s with an encoder. ``model`` names the model and
may be left out when one model of the route's kind is loaded.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from aiayn.decoding.options import SearchConfig
from aiayn.serve.connections import LEFT
from aiayn.serve.dependencies import ServerDep, parse
from aiayn.serve.jobs import Classification, Generation, MaskFilling, Prompt, Translation
from aiayn.serve.schemas import (
    ERRORS,
    MAX_FILLERS,
    ClassifyRequest,
    ClassifyResponse,
    FillMaskRequest,
    FillMaskResponse,
    GenerateRequest,
    GenerateResponse,
    NativeTranslateRequest,
    NativeTranslateResponse,
    request_body,
)
from aiayn.serve.sentences import joined_texts, pieces_of
from aiayn.serve.server import HTTPError, invalid, text_problem
from aiayn.serve.services import EncoderService, LMService, OverLimit, TranslationService

log = logging.getLogger("aiayn.serve")
router = APIRouter(prefix="/v1", tags=["native"], responses=ERRORS)

EVENTS = 'with stream: true, events data: {"text": …}, then data: {"done": true, "text": …}'
STREAM = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}, "description": EVENTS}}


@router.post(
    "/translate",
    response_model=NativeTranslateResponse,
    response_model_exclude_none=True,
    openapi_extra=request_body(NativeTranslateRequest),
)
async def translate(
    request: Request,
    body: Annotated[NativeTranslateRequest, Depends(parse(NativeTranslateRequest))],
    server: ServerDep,
) -> NativeTranslateResponse:
    """Translate with every decoding option of ``aiayn translate``; ``attention: true`` adds every
    layer's and head's weights."""
    texts = server.texts(body.q)
    service = server.pick(body.model, TranslationService)
    config, limit = server.search_config(body.given()), server.settings.max_attention_values
    if config.r2l_beam is not None and not service.translator.model.config.bidirectional:  # as the CLI says
        raise invalid(f"r2l_beam: {service.name!r} is not a bidirectional model (model.bidirectional=true); "
                      "leave r2l_beam out")  # fmt: skip
    job = Translation(service.name, config, body.attention, limit if body.attention else 0)  # == /translate's
    split = server.sentences(texts, service.source) if body.sentences else None
    pieces = pieces_of(split) if split is not None else texts
    sources, cut = service.encode(pieces)  # a text the tokenizer refuses fails here, not in a batch
    if body.attention:  # a source too long for the limit is refused before any search, not after
        try:
            service.check_attention_floor(sources, limit)
        except OverLimit as e:  # answered as the same refusal after a search is
            raise HTTPError(413, str(e)) from None
    results = await server.submit(job, sources, len(pieces), request) if pieces else []
    for i in cut:  # translated in part: said, as the CLI warns
        results[i] = {**results[i], "truncated": True}
    if split is not None:
        results = joined_texts(split, results)
    return NativeTranslateResponse(
        model=service.name, source=service.source, target=service.target, results=results
    )


@router.post(
    "/generate",
    response_model=GenerateResponse,
    responses=STREAM,
    openapi_extra=request_body(GenerateRequest),
)
async def generate(
    request: Request, body: Annotated[GenerateRequest, Depends(parse(GenerateRequest))], server: ServerDep
) -> GenerateResponse | StreamingResponse:
    """Continue ``prompt`` with a language model; ``stream: true`` sends each piece of text as a
    server-sent event (``data: {"text": …}``), then ``data: {"done": true, "text": …}``."""
    service = server.pick(body.model, LMService)
    limits = server.settings
    if len(body.prompt) > limits.char_limit:
        raise invalid(f"prompt exceeds character limit ({limits.char_limit})")
    if (problem := text_problem(body.prompt)) is not None:
        raise invalid(f"prompt {problem}")
    ids = tuple(service.generator.encode(body.prompt))  # an empty prompt, or characters it lacks: 400 now
    if not 1 <= body.max_new_tokens <= limits.max_new_tokens:
        raise invalid(f"max_new_tokens must be in 1..{limits.max_new_tokens}")
    given = body.given()
    if body.greedy and given.get("sample"):
        raise invalid("greedy: true and sample: true contradict each other; give one of them")
    unread = [k for k in GENERATE_UNREAD if k in given and given[k] != GENERATE_UNREAD[k]]
    if unread:  # one continuation, token by token: a search's options would be ignored
        raise invalid(f"{', '.join(unread)}: not read by /v1/generate (one continuation, token by token); "
                      "leave them out")  # fmt: skip
    if not body.stop_at_eos and "min_len" not in given:  # aiayn generate's default: no eos before the end
        given["min_len"] = min(body.max_new_tokens, limits.max_len)
    config = server.search_config(given, beam=1, sample=not body.greedy)
    if not body.stream:
        prompt = Prompt(ids, body.max_new_tokens, config, lambda _: True)
        text, _ = await server.submit(Generation(service.name), prompt, 1, request)
        return GenerateResponse(model=service.name, prompt=body.prompt, text=text)
    stream = _Stream(asyncio.get_running_loop(), request.scope)
    # queued before the answer starts: a full queue is a 429, not an event of a stream already 200
    queued = server.enqueue(Generation(service.name), stream.prompt(body, config, ids), 1)
    job = asyncio.ensure_future(server.result(queued, request))  # a client that leaves: 499, job dropped
    return StreamingResponse(stream.events(job), media_type="text/event-stream")


# /v1/generate's own values of the search options it does not read (others are refused)
GENERATE_UNREAD = {"beam": 1, "nbest": 1, "lenpen": SearchConfig.lenpen,
                   "lenpen_kind": SearchConfig.lenpen_kind, "max_len": None,
                   "max_len_b": SearchConfig.max_len_b, "r2l_beam": None, "mbr": None}  # fmt: skip


class _Stream:
    """Server-sent events of one generation: each piece as the worker thread makes it, then the whole
    text, or the error of a job that failed after the stream began (its status is 200 by then).
    Leaving ``events`` (the client went away, or the end) tells the worker to stop, and a job still
    queued is cancelled: the worker skips it. A stream left before its last event is logged 499
    (``LEFT`` in the request's scope), as an answer its client did not wait for."""

    def __init__(self, loop: asyncio.AbstractEventLoop, scope: dict):
        self.loop, self.queue, self.alive, self.scope = loop, asyncio.Queue(), True, scope

    def prompt(self, body: GenerateRequest, config: SearchConfig, ids: tuple[int, ...]) -> Prompt:
        def emit(piece: str) -> bool:  # called from the worker thread
            self.loop.call_soon_threadsafe(self.queue.put_nowait, {"text": piece})
            return self.alive

        return Prompt(ids, body.max_new_tokens, config, emit)

    async def events(self, job: asyncio.Future) -> AsyncIterator[str]:
        ended = False
        try:
            while True:
                getter = asyncio.ensure_future(self.queue.get())
                done, _ = await asyncio.wait({getter, job}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield _event(getter.result())
                    continue
                getter.cancel()
                error = None if job.cancelled() else job.exception()
                if isinstance(error, HTTPError) and error.status == 499:
                    return  # the client has gone: nobody reads further events
                while not self.queue.empty():
                    yield _event(self.queue.get_nowait())
                try:
                    yield _event({"done": True, "text": job.result()[0]})
                except HTTPError as e:
                    yield _event({"error": e.message})
                except Exception:  # a model error after the 200 began: logged, and the stream ends cleanly
                    log.exception("POST /v1/generate failed while streaming")
                    yield _event({"error": "internal error: the server failed on this request"})
                ended = True
                return
        finally:
            self.alive = False  # stop sampling
            job.cancel()  # a job not yet started is skipped
            if not ended:
                self.scope[LEFT] = True


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


@router.post(
    "/classify",
    response_model=ClassifyResponse,
    openapi_extra=request_body(ClassifyRequest),
)
async def classify(
    request: Request, body: Annotated[ClassifyRequest, Depends(parse(ClassifyRequest))], server: ServerDep
) -> ClassifyResponse:
    """Label ``q`` (a string or a list) with a classifier; ``top_k`` labels each."""
    many, texts = isinstance(body.q, list), server.texts(body.q)
    blank = [i for i, text in enumerate(texts) if not text.strip()]
    if blank:  # aiayn classify gives a blank line no label either
        where = f"q[{blank[0]}]" if many else "q"
        raise invalid(f"{where} is blank: there is no text to label")
    service = server.pick(body.model, EncoderService, can="classifier")
    results = await server.submit(Classification(service.name, body.top_k), texts, len(texts), request)
    return ClassifyResponse(model=service.name, results=results if many else results[0])


@router.post(
    "/fill-mask",
    response_model=FillMaskResponse,
    openapi_extra=request_body(FillMaskRequest),
)
async def fill_mask(
    request: Request, body: Annotated[FillMaskRequest, Depends(parse(FillMaskRequest))], server: ServerDep
) -> FillMaskResponse:
    """The ``top_k`` pieces at each ``<mask>`` of ``q``."""
    texts = server.texts(body.q)
    if len(texts) != 1:
        raise invalid("fill-mask takes one q")
    service = server.pick(body.model, EncoderService, can="filler")
    ids, n = service.query_ids(texts[0])
    if n * body.top_k > MAX_FILLERS:  # each filler carries the whole text
        raise invalid(f"{n} <mask>s × top_k={body.top_k} is over the {MAX_FILLERS} fillers an answer holds; "
                      "give fewer masks or a smaller top_k")  # fmt: skip
    masks = await server.submit(MaskFilling(service.name, body.top_k), (texts[0], ids), 1, request)
    return FillMaskResponse(model=service.name, masks=masks)
