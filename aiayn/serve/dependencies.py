"""The checks every route with a body shares, as FastAPI dependencies, in the order they run.

``read_body`` reads the raw stream up to ``max_body_bytes`` and no further (413 past it), within
``body_timeout_s`` (408 past it), and parses it as JSON or, as LibreTranslate also accepts, a form
(URL-encoded, or multipart as browsers' ``FormData`` and ``curl -F`` send it, read by python-multipart;
a file part is refused) with the URL's query parameters (not beside JSON): any failure of a parser,
a nesting too deep or a number too long included, or text that is not UTF-8, is 400;
``require_api_key`` checks the key (403) in the body (or a form's query string) or the ``X-API-Key``
header; ``parse(Model)`` validates the parsed body with a schema (400, "Invalid request: …"). A route
does not declare its body model as a parameter, since FastAPI would then read the whole body itself
before any dependency runs; ``schemas.request_body`` documents it instead. FastAPI runs each
dependency once per request, so the body is read once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError
from python_multipart import create_form_parser
from python_multipart.exceptions import FormParserError
from starlette.requests import ClientDisconnect

from aiayn.serve.server import HTTPError, Server, invalid

M = TypeVar("M", bound=BaseModel)
FORM_FIELDS = 32  # the fields a form may hold besides its texts (q): source, target, api_key, …


async def get_server(request: Request) -> Server:
    return request.app.state.server


ServerDep = Annotated[Server, Depends(get_server)]


async def read_body(request: Request, server: ServerDep) -> dict[str, Any]:
    """The JSON or form-encoded body as a dict, read up to ``max_body_bytes``."""
    limit = server.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"the body is over {limit} bytes")
    chunks: list[bytes] = []
    seconds = server.settings.body_timeout_s

    async def receive() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"the body is over {limit} bytes")
            chunks.append(chunk)

    try:  # a client that sends slowly holds a connection no longer (wait_for: Python 3.10 too)
        await asyncio.wait_for(receive(), seconds)
    except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
        raise HTTPError(408, f"the body did not arrive within {seconds:g} s (--body-timeout)",
                        {"Connection": "close"}) from None  # fmt: skip
    except ClientDisconnect:  # it left before its body was in: its choice, not a failure of ours
        raise HTTPError(499, "client closed the request") from None
    raw = b"".join(chunks)
    most = server.settings.batch_limit + FORM_FIELDS  # a form's fields: its texts and the options
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json" and len(raw) + len(request.url.query) > limit:  # a form's query is read
        raise HTTPError(413, f"the body and its query string are over {limit} bytes")
    if kind == "multipart/form-data":
        parameters = request.headers["content-type"].partition(";")[2]  # the boundary
        return _with_query(_form(_multipart(raw, f"{kind};{parameters}", most)), request, most)
    try:
        text = raw.decode("utf-8-sig")  # a byte order mark first, as Windows PowerShell 5 sends it
    except UnicodeDecodeError as e:
        raise invalid(f"the body is not UTF-8 ({e.reason} at byte {e.start})") from None
    untyped_form = not kind and "=" in text and not text.lstrip().startswith("{")
    if kind == "application/x-www-form-urlencoded" or untyped_form:
        return _with_query(_form(_parse_qsl(text, "the form", most)), request, most)
    if kind not in ("application/json", ""):
        raise HTTPError(415, f"content type {kind!r} is not JSON or form-encoded")
    if not text.strip():  # nothing: a form's fields may all be in the query (not beside JSON)
        return {} if kind == "application/json" else _with_query({}, request, most)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise invalid(f"malformed JSON ({e.msg} at line {e.lineno})") from None
    except (ValueError, RecursionError) as e:  # a number of over 4300 digits, a nesting too deep
        raise invalid(f"JSON this server does not read ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(data, dict):
        raise invalid("the body must be a JSON object")
    return data


BodyDep = Annotated[dict[str, Any], Depends(read_body)]


def _parse_qsl(text: str, what: str, most: int) -> list[tuple[str, str]]:
    try:
        return parse_qsl(text, keep_blank_values=True, errors="strict", max_num_fields=most)
    except UnicodeDecodeError as e:
        raise invalid(f"{what} is not UTF-8 once decoded ({e.reason})") from None
    except ValueError:  # counted before any is parsed: 700,000 empty fields are not parsed first
        raise invalid(f"{what} has more than {most} fields") from None


def _with_query(form: dict[str, Any], request: Request, most: int) -> dict[str, Any]:
    """A form's (or an empty body's) fields with the URL's query parameters, which win, as in
    LibreTranslate (Flask's ``request.values`` looks in the query first); a JSON body is read alone."""
    return {**form, **_form(_parse_qsl(request.url.query, "the query string", most))}


def _form(fields: list[tuple[str, str]]) -> dict[str, Any]:
    """A form's fields as a dict: the last value of each, except ``q`` given more than once, which
    is the list of texts (LibreTranslate's batch form)."""
    values: dict[str, list[str]] = {}
    for name, value in fields:
        values.setdefault(name, []).append(value)
    return {k: v if k == "q" and len(v) > 1 else v[-1] for k, v in values.items()}


def _multipart(raw: bytes, content_type: str, most: int) -> list[tuple[str, str]]:
    """The fields of a multipart/form-data body, in order (400 for a malformed one, a file part, a
    field that is not UTF-8, or more than ``most`` fields: the parser stops there)."""
    fields: list[tuple[bytes, bytes]] = []

    def on_file(file) -> None:  # refused at the first: the rest of the body is not parsed
        name = (file.field_name or b"").decode("utf-8", "replace")
        raise invalid(f"file parts are not read (field {name!r}): send text fields")

    def on_field(field) -> None:
        if len(fields) == most:
            raise invalid(f"the form has more than {most} fields")
        fields.append((field.field_name or b"", field.value or b""))

    try:
        parser = create_form_parser(
            {"Content-Type": content_type.encode("latin-1")},
            on_field,
            on_file,
            config={"MAX_MEMORY_FILE_SIZE": len(raw) + 1},  # never spilled to disk: the body is bounded
        )
        parser.write(raw)
        parser.finalize()
    except (FormParserError, UnicodeEncodeError) as e:
        raise invalid(f"malformed multipart body ({e})") from None
    try:
        return [(name.decode("utf-8"), value.decode("utf-8")) for name, value in fields]
    except UnicodeDecodeError as e:
        raise invalid(f"a form field is not UTF-8 ({e.reason})") from None


async def require_api_key(request: Request, data: BodyDep, server: ServerDep) -> None:
    """With ``--api-keys``, the body's ``api_key`` or the ``X-API-Key`` header must be one of them."""
    keys = server.settings.api_keys
    given = data.get("api_key") or request.headers.get("x-api-key")
    if keys and (not isinstance(given, str) or given not in keys):
        raise HTTPError(403, "Invalid API key")


def parse(model: type[M]) -> Callable[..., Awaitable[M]]:
    """A dependency giving the body validated as ``model``, once the key is checked."""

    async def dependency(data: BodyDep, _: Annotated[None, Depends(require_api_key)]) -> M:
        try:
            return model.model_validate(data)
        except ValidationError as e:
            raise invalid(problem(model, e)) from None

    return dependency


PROBLEMS = {
    "extra_forbidden": "is not a field of this request (its fields: /docs)",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
}


def problem(model: type[BaseModel], error: ValidationError) -> str:
    """The first problem of a body, in one line that names the field and the value, in the words
    ``SearchConfig`` uses for the same mistakes."""
    e = error.errors()[0]
    field, kind = str(e["loc"][0]) if e["loc"] else "body", e["type"]
    if kind in ("missing", "string_too_short"):  # an empty target is a missing one
        return f"missing {field} parameter"
    given = f"{field}={_shown(e['input'])}"
    if kind == "literal_error":
        return f"{given} is not {e['ctx']['expected']}"
    if kind in ("greater_than_equal", "less_than_equal"):  # the ranges are of integers (top_k)
        meta = model.model_fields[field].metadata
        lo = next((m.ge for m in meta if hasattr(m, "ge")), "")
        hi = next((m.le for m in meta if hasattr(m, "le")), "")
        return f"{field} must be an integer in {lo}..{hi}"
    if kind in PROBLEMS:
        return f"{given} {PROBLEMS[kind]}"
    return e["msg"]  # our own errors (``schemas.Texts``) read as a sentence already


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
