"""The bodies the routes read and the answers they give, as Pydantic models (``/docs`` shows them).

Request models are strict (an integer field refuses ``3.0`` and ``"3"``, a boolean field refuses
``"false"``, which would otherwise read as true), except ``alternatives``, which LibreTranslate's
form-encoded bodies send as text. Unknown fields are ignored (clients send LibreTranslate fields this
server does not use). The decoding options are only type-checked here: their ranges and agreements
are ``SearchConfig``'s, so that the CLI and the server refuse the same things. Answer models leave
out the fields a route did not fill (the routes set ``response_model_exclude_none``). The class
docstrings and field descriptions are what ``/docs`` shows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from aiayn.decoding.mbr import UTILITIES
from aiayn.decoding.options import SearchConfig


def _text_if_unset(value: Any) -> Any:
    """LibreTranslate reads a ``format`` sent empty or null as "text" (clients send unset fields so)."""
    return "text" if value is None or value == "" else value


def _texts(value: Any) -> Any:
    if isinstance(value, list):
        if not all(isinstance(t, str) for t in value):
            raise PydanticCustomError("texts", "each q must be a string")
    elif not isinstance(value, str):
        raise PydanticCustomError("texts", "q must be a string")
    return value


Texts = Annotated[
    str | list[str],
    BeforeValidator(_texts),
    Field(description="a text, or a list of texts (the answer then has a list in the same order)"),
]


class ErrorResponse(BaseModel):
    error: str = Field(description="what went wrong, in one line")


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("Invalid request: a field, a limit, or a model or language pair that is not loaded"),
    403: _error("A missing or wrong API key (with --api-keys)"),
    408: _error("The body did not arrive within --body-timeout"),
    413: _error("The body is over --max-body-bytes, or the answer over --max-attention-values"),
    415: _error("The body is neither JSON nor form-encoded"),
    429: _error("The queue is full: retry after the Retry-After header's seconds"),
    503: _error("The request waited past --timeout"),
    500: _error("The server failed on this request"),
}


def request_body(model: type[BaseModel], *, form: bool = False) -> dict[str, Any]:
    """``openapi_extra`` documenting ``model`` as a route's body. A dependency reads the body (so that
    it can stop at the size limit), and FastAPI documents only the bodies it reads itself."""
    schema = model.model_json_schema()
    forms = ["application/x-www-form-urlencoded", "multipart/form-data"]
    kinds = ["application/json"] + (forms if form else [])
    return {"requestBody": {"required": True, "content": {k: {"schema": schema} for k in kinds}}}


class Body(BaseModel):
    """What every body may carry."""

    model_config = ConfigDict(strict=True)
    api_key: str | None = Field(None, description="one of the server's --api-keys (or the X-API-Key header)")


# -- LibreTranslate ---------------------------------------------------------------------------------
class TranslateRequest(Body):
    """LibreTranslate's /translate body, JSON or a form (where q given twice is a list)."""

    q: Texts
    source: str = Field("auto", description="the source language's code, or auto")
    target: str = Field(min_length=1, description="the target language's code (see /languages)")
    format: Annotated[Literal["text", "html"], BeforeValidator(_text_if_unset)] = Field(
        "text", description="html: the texts between the tags are translated, the markup kept (empty: text)"
    )
    alternatives: int = Field(
        0, strict=False, description="other translations per text, 0 to the server's --max-beam − 1"
    )


class DetectRequest(Body):
    """LibreTranslate's /detect body, JSON or a form."""

    q: Texts


class DetectedLanguage(BaseModel):
    confidence: float = Field(description="always 100: the model's source language")
    language: str = Field(description="the source language's code")


class TranslateResponse(BaseModel):
    translatedText: str | list[str] = Field(description="per text when q is a list")  # LibreTranslate's names
    alternatives: list[str] | list[list[str]] | None = Field(None, description="with alternatives > 0")
    detectedLanguage: DetectedLanguage | list[DetectedLanguage] | None = Field(
        None, description="with source auto"
    )


class Language(BaseModel):
    code: str = Field(description="a language's code")
    name: str = Field(description="its English name")
    targets: list[str] = Field(description="the codes it translates into (none: only a target)")


# -- the native API ----------------------------------------------------------------------------------
class SearchOptions(Body):
    """Every decoding option of aiayn translate, with its defaults. A field the native API does not
    know is an error (a misspelt option would otherwise decode with the default, silently)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    beam: int = Field(SearchConfig.beam, description="beam size, up to the server's --max-beam; 1 = greedy")
    nbest: int = Field(
        SearchConfig.nbest, description="hypotheses returned per text (≤ beam), or samples (≤ --max-beam)"
    )
    lenpen: float = Field(SearchConfig.lenpen, description="α of the length penalty; 0 = log-probability")
    lenpen_kind: str = Field(
        SearchConfig.lenpen_kind, description="gnmt: ((5 + |Y|) / 6)^α (Wu et al.); simple: |Y|^α"
    )
    max_len: int | None = Field(
        None,
        description="output tokens at most, up to the server's --max-len (default: input + max_len_b, or "
        "min_len + 1 if more)",
    )
    max_len_b: int = Field(
        SearchConfig.max_len_b, description="the + 50 of the default max_len (≤ --max-len)"
    )
    min_len: int = Field(
        SearchConfig.min_len, description="no end of sentence before this many tokens (≤ --max-len)"
    )
    sample: bool = Field(SearchConfig.sample, description="sample instead of searching")
    temperature: float = Field(SearchConfig.temperature, description="sampling: divide log-probs by T")
    top_k: int | None = Field(None, description="sampling: keep the k most probable tokens")
    top_p: float | None = Field(None, description="sampling: keep the smallest set with probability ≥ p")
    seed: int | None = Field(None, description="sampling: the random generator's seed")
    r2l_beam: int | None = Field(None, description="a bidirectional model's right-to-left beam (or beam)")
    mbr: str | None = Field(
        None, description=f"order the beam by minimum Bayes risk: {' or '.join(UTILITIES)}"
    )

    def given(self) -> dict[str, Any]:
        """The decoding options the body set (the route's own defaults stand for the others)."""
        return self.model_dump(include=set(SearchOptions.model_fields) - {"api_key"}, exclude_unset=True)


class NativeTranslateRequest(SearchOptions):
    """The texts, the model, and every decoding option of aiayn translate."""

    q: Texts
    model: str | None = Field(None, description="a translation model's name (optional when one is loaded)")
    attention: bool = Field(
        False, description="add every layer's and head's attention weights, up to --max-attention-values"
    )
    sentences: bool = Field(
        False,
        description="translate each text sentence by sentence (its lines, then their sentences, as "
        "/translate does, up to --sentence-limit): each result then has its sentences' own results",
    )


class Hypothesis(BaseModel):
    text: str = Field(description="the detokenized output")
    score: float = Field(description="log-probability, length-penalised")
    tokens: list[int] = Field(description="the output's token ids")


class Attention(BaseModel):
    """The best hypothesis' attention weights, [layer][head][query][key]; empty for an ensemble."""

    model_config = ConfigDict(extra="allow")
    src_tokens: list[str] | None = Field(None, description="the source's pieces, end of sentence included")
    tgt_tokens: list[str] | None = Field(None, description="the decoder's input: <s> and the output")
    encoder: list[list[list[list[float]]]] | None = Field(None, description="encoder self-attention")
    decoder_self: list[list[list[list[float]]]] | None = Field(None, description="decoder self-attention")
    cross: list[list[list[list[float]]]] | None = Field(None, description="decoder-encoder attention")
    r2l_tokens: list[str] | None = Field(
        None,
        description="a bidirectional model's right-to-left decoder input: <s> and its translation, reversed",
    )
    r2l_self: list[list[list[list[float]]]] | None = Field(
        None, description="right-to-left decoder self-attention"
    )
    r2l_cross: list[list[list[list[float]]]] | None = Field(
        None, description="right-to-left decoder-encoder attention"
    )
    cross_r2l: list[list[list[list[float]]]] | None = Field(
        None, description="the fourth sublayer: the decoder reading the right-to-left decoder's states"
    )


class TranslationResult(BaseModel):
    translation: str = Field(description="the best hypothesis' text")
    hypotheses: list[Hypothesis] = Field(description="nbest hypotheses, best first")
    attention: Attention | None = Field(None, description="with attention: true")
    r2l: str | None = Field(
        None, description="a bidirectional model's right-to-left translation, whose states the answer read"
    )
    truncated: bool = Field(
        False,
        description="the text has more source tokens than the model reads: its first part is translated",
    )
    sentences: list[TranslationResult] | None = Field(
        None,
        description="with sentences: true, one result per sentence (attention there); the text's translation "
        "and hypotheses join theirs, rank by rank, scores summed and tokens one sentence after another",
    )


class NativeTranslateResponse(BaseModel):
    model: str = Field(description="the model's name")
    source: str = Field(description="its source language")
    target: str = Field(description="its target language")
    results: list[TranslationResult] = Field(description="one per text")


class GenerateRequest(SearchOptions):
    """A prompt for a language model, and how to sample its continuation."""

    prompt: str = Field("\n", description="the text to continue, up to the server's --char-limit")
    max_new_tokens: int = Field(100, description="tokens to add, 1 to the server's --max-new-tokens")
    greedy: bool = Field(False, description="take the most probable token instead of sampling")
    stream: bool = Field(False, description="send server-sent events, one per piece of text")
    stop_at_eos: bool = Field(
        False,
        description="end when the model emits eos (aiayn generate --stop-at-eos); without it, and without "
        "min_len, no eos before max_new_tokens, as the CLI (a model trained by aiayn on a text stream never "
        "emits eos; GPT-2 does)",
    )
    model: str | None = Field(None, description="a language model's name (optional when one is loaded)")
    beam: int = Field(1, description="1: one token at a time")
    sample: bool = Field(True, description="false (or greedy: true) takes the most probable token")


class GenerateResponse(BaseModel):
    model: str = Field(description="the model's name")
    prompt: str = Field(description="the prompt, as given")
    text: str = Field(description="what the model added to the prompt")


class ClassifyRequest(Body):
    """Texts to label with an encoder's classification head."""

    model_config = ConfigDict(strict=True, extra="forbid")

    q: Texts
    model: str | None = Field(None, description="an encoder's name (optional when one is loaded)")
    top_k: int = Field(1, ge=1, le=100, description="labels per text, most probable first")


class Label(BaseModel):
    label: str = Field(description="a class name")
    probability: float


class ClassifyResponse(BaseModel):
    model: str = Field(description="the model's name")
    results: list[Label] | list[list[Label]] = Field(description="per text when q is a list")


# fillers in one fill-mask answer (<mask>s × top_k): each carries the whole text, so that 800 masks of a
# 5,000-character text at top_k 100 do not make a 400 MB answer
MAX_FILLERS = 100


class FillMaskRequest(Body):
    """One text whose <mask> pieces an encoder fills."""

    model_config = ConfigDict(strict=True, extra="forbid")

    q: Texts = Field(description="one text with one or more <mask>")
    model: str | None = Field(None, description="an encoder's name (optional when one is loaded)")
    top_k: int = Field(
        5,
        ge=1,
        le=MAX_FILLERS,
        description=f"pieces per <mask>, most probable first; <mask>s × top_k at most {MAX_FILLERS}",
    )


class Filler(BaseModel):
    token: str = Field(description="a piece for the mask")
    probability: float
    sequence: str = Field(description="the text with this piece at the mask")


class FillMaskResponse(BaseModel):
    model: str = Field(description="the model's name")
    masks: list[list[Filler]] = Field(description="per <mask>, in order")


# -- operations ------------------------------------------------------------------------------------
class ModelInfo(BaseModel):
    name: str = Field(description="what a request's model field names")
    kind: str = Field(description="translation, lm or encoder")
    source: str | None = Field(None, description="a translation model's source language")
    target: str | None = Field(None, description="a translation model's target language")
    classify: bool | None = Field(None, description="an encoder: has a classification head")
    fill_mask: bool | None = Field(None, description="an encoder: has a <mask> piece")


class Limits(BaseModel):
    """What one request may ask for at most (the server's options), for a client to offer no more."""

    max_beam: int = Field(description="beam, nbest and r2l_beam (--max-beam)")
    max_new_tokens: int = Field(description="/v1/generate's max_new_tokens (--max-new-tokens)")
    max_len: int = Field(description="max_len and min_len (--max-len)")
    char_limit: int = Field(description="characters of a text (--char-limit)")
    batch_limit: int = Field(description="texts of a request (--batch-limit)")


class Health(BaseModel):
    status: str = Field(description="ok, or stuck (503): every worker has been on one batch past --timeout")
    version: str = Field(description="aiayn's version")
    queue: int = Field(description="requests waiting for the model")
    busy_s: list[float] = Field(description="seconds each busy worker has spent on its current batch")
    models: list[ModelInfo]
    limits: Limits
