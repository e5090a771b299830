"""HTTP routes: ``embeddings`` (OpenAI + TEI embed), ``similarity``, ``meta`` (models, info, health, ready, metrics)."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from service.http.errors import APIError
from service.http.middleware import WRITE_FLAG
from service.inference.embedder import Embedder
from service.settings import Settings

if TYPE_CHECKING:
    from fastapi._compat import ModelField  # the type of APIRoute.body_field


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Compact JSON without response-model validation, encoded by orjson on the event loop: numpy arrays (embeddings)
    are written directly, float32 at float32 precision (each value reads back as the same float32), about 14x faster
    than ``json.dumps`` of their ``tolist()`` (9 vs 133 ms for 512 x 384 on an AMD EPYC), so a big response does not
    hold up the event loop. A value orjson cannot write (an integer past 64 bits, which a recovered snapshot may hold
    in a payload) is written exactly by the standard library's encoder instead of failing the request."""
    try:
        body = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        body = json.dumps(obj, default=_plain, separators=(",", ":"), ensure_ascii=False).encode()
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _plain(value: Any) -> Any:
    """``value`` as the standard library's encoder can write it: numpy arrays as lists, numpy scalars as numbers.

    Raises:
        TypeError: anything else (the encoder's own error for an unserialisable value).
    """
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


OFFLOAD_BODY_BYTES = 256 * 1024  # JSON bodies at least this big are parsed on a worker thread


class JSONRequest(Request):
    """A request whose JSON body is parsed by orjson (~4x faster than the standard library's ``json``: 25 vs 100 ms
    for a 4 MB upsert of 1,024 vectors on an AMD EPYC), on a worker thread from :data:`OFFLOAD_BODY_BYTES` up, so a
    big body does not hold up the event loop. A body orjson refuses or could misread is read by the standard library
    instead (:func:`_loads`), whose errors, and the request validation of what only it reads (``NaN``, integers past
    64 bits), answer as before."""

    async def json(self) -> Any:
        """The parsed body, cached (Starlette ``Request.json``); raises ``json.JSONDecodeError`` when invalid."""
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = await run_in_threadpool(_loads, body) if len(body) >= OFFLOAD_BODY_BYTES else _loads(body)
        return self._json

    async def validate_off_loop(self, field: ModelField) -> None:
        """Parse and validate a big JSON body against the route's body ``field`` on a worker thread, so that neither
        holds up the event loop (pydantic validation of a 17 MB upsert takes seconds, its Python validators included).
        The validated value is what :meth:`json` then answers, which FastAPI's own validation passes through (a model
        instance is not validated again: pydantic's ``revalidate_instances='never'``). A body that is not JSON is left
        for FastAPI to report as it does.

        Raises:
            RequestValidationError: the body does not validate (the same errors FastAPI gives, ``loc`` from ``body``).
        """
        body = await self.body()

        def parsed_and_validated() -> tuple[Any, Any, list[Any]]:
            raw = _loads(body)
            return (raw, *field.validate(raw, {}, loc=("body",)))

        try:
            raw, value, errors = await run_in_threadpool(parsed_and_validated)
        except ValueError:  # not JSON (UnicodeDecodeError included): FastAPI's path answers it
            return
        if errors:
            raise RequestValidationError(errors, body=raw)
        self._json = value


# digits -> "0"; what may stand before the digits of a fraction or an exponent ("." "e" "E") -> "."; anything else
# -> " ". An integer literal past 2**64 is then a " " followed by 20 "0"s (or 20 "0"s opening the body), while a
# float's long fraction (``0.00012345678901234567``) is not: vectors of such floats stay on orjson.
_DIGITS = bytes(48 if 48 <= c <= 57 else 46 if c in b".eE" else 32 for c in range(256))
_LONG_RUN = b"0" * 20  # an integer literal past 2**64 has at least 20 digits


def _loads(body: bytes) -> Any:
    """orjson's parse, unless the body holds an integer literal of 20 digits or more (orjson reads an integer past
    64 bits as a float, silently: the standard library keeps it exact, and validation refuses it) or orjson refuses
    it: then the standard library's (~7 ms to look for the literal in a 4 MB body), on the body decoded as strict
    UTF-8 (RFC 8259: JSON exchanged between systems is UTF-8; given bytes, ``json.loads`` would also take UTF-16/32
    and let lone surrogates through, which no text model can take).

    Raises:
        UnicodeDecodeError: the body is not UTF-8 (a 422 via :mod:`service.http.errors`).
        ValueError: not JSON.
    """
    shape = body.translate(_DIGITS)
    if shape.find(b" " + _LONG_RUN) < 0 and not shape.startswith(_LONG_RUN):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return json.loads(body.decode("utf-8"))


class JSONRoute(APIRoute):
    r"""The service's route class (``APIRouter(route_class=JSONRoute)``): requests are :class:`JSONRequest`\ s
    (FastAPI's documented custom request/route class pattern)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, given a :class:`JSONRequest` (FastAPI docs, "Custom Request and APIRoute class")."""
        handler = super().get_route_handler()
        single = self.body_field is not None and len(self.dependant.body_params) == 1 and not self._embed_body_fields
        field = self.body_field if single else None  # FastAPI validates the whole body against it

        async def json_handler(request: Request) -> Response:
            req = JSONRequest(request.scope, request.receive)
            if field is not None and _is_json(req.headers.get("content-type")):
                if len(await req.body()) >= OFFLOAD_BODY_BYTES:
                    await req.validate_off_loop(field)
            return await handler(req)

        return json_handler


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this content type as JSON (``application/json`` or ``application/*+json``)."""
    if not content_type:
        return False
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime.startswith("application/") and (mime == "application/json" or mime.endswith("+json"))


def mark_write(request: Request) -> None:
    """Dependency of the routes that change stored data: if the request runs past ``request_timeout_s``, its 503
    says that the write may already have been applied (see ``service.http.middleware``)."""
    setattr(request.state, WRITE_FLAG, True)


def embedder_of(request: Request) -> Embedder:
    """``app.state.embedder``, or 503 while the service is not ready."""
    emb = getattr(request.app.state, "embedder", None)
    if emb is None:
        raise APIError(503, "service is starting", code="model_not_ready")
    return emb


def check_client_batch(n: int, settings: Settings, param: str) -> None:
    """413 ``too_many_inputs`` when a request carries more than ``max_client_batch_size`` inputs."""
    if n > settings.max_client_batch_size:
        raise APIError(
            413,
            f"{n} inputs in one request; the maximum is {settings.max_client_batch_size} (max_client_batch_size)",
            param=param,
            code="too_many_inputs",
        )


def refuse_prompt_name(prompt_name: str | None) -> None:
    """TEI's ``prompt_name`` on ``/rerank``: a reranker artifact carries no prompts (the artifact contract refuses
    them on one), so a name is refused rather than silently ignored. The embedding routes apply prompts instead
    (:mod:`service.inference.prompts`).

    Raises:
        APIError: 422 ``invalid_value`` on ``prompt_name`` when one is given.
    """
    if prompt_name is not None:
        raise APIError(
            422,
            f"prompt_name {prompt_name!r}: rerankers take no prompts; prepend the text yourself",
            param="prompt_name",
            code="invalid_value",
        )
