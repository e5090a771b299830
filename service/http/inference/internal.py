"""``POST /internal/embed``: the embedding call of a front process (``service.front``) to the core, in a compact form.

With ``api_workers`` > 1 (``service.supervisor``) the client's ``POST /v1/embeddings`` and ``POST /embed`` are parsed,
validated and answered by front processes; the core, which owns the models and their batchers, gets only this
call, over its private Unix socket (mode 0600 in a 0700 directory: only this user's processes reach it, and a front
refuses to proxy ``/internal/``; nothing reaches it from the public port). :class:`InternalFirst` answers it before
the core's middleware and router (the front has already checked the key, the body and the batch size, and its
middleware holds the time budget), so the core's event loop spends on it only uvicorn's HTTP parsing, the JSON
list of texts and the rows' bytes: neither the client's JSON nor the JSON (or base64) answer.

Request: ``application/json`` ``{"texts": [str], "options": {...}, "tokens": {...}?}`` where ``options`` are keyword
arguments of ``Embedder.encode`` (:data:`OPTIONS`; the front has validated them with the request models of
``service.http.inference.schemas``) and ``tokens``, when the front tokenized the texts itself
(``service.front.tokenizing``), is ``{"model": "name:version", "sha256", "lengths": [int], "ids": base64 of the
ids as little-endian int32, concatenated}`` (``Embedder.encode``'s ``token_ids``: used only for that model).
JSON rather than a binary framing: orjson parses a list of strings about as fast as the texts could be sliced out
of a length-prefixed buffer (``bench/serving/loop_split.py``: 6 us for 32 sentences, rows' bytes included).

Response 200: ``application/octet-stream``, the embeddings as little-endian float32 bytes, ``rows x dim``
(C order), with the headers ``X-Model`` (``name:version``), ``X-Model-Sha256``, :data:`DIM`, :data:`TOKENS`,
:data:`MAX_SEQ`, :data:`PATH_HEADER` (the artifact's directory: where a front loads its tokenizer from). Raw
bytes, not JSON: the core copies the array once (``tobytes``) and the front reads it back with ``numpy.frombuffer``
at no cost. An error is the answer the core gives it in one process (``service.http.errors``:
status, JSON body, headers), which the front passes on unchanged. A front that closes the connection (its client
went away, or its time budget ran out) has the call cancelled, its queued inputs dropped (status 499 in the metrics).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI

from service.http.errors import APIError, to_api_error
from service.inference.embedder import TokenIds
from service.metrics import Metrics

log = logging.getLogger("service.http")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PATH = "/internal/embed"
#: the keyword arguments of ``Embedder.encode`` a front may pass, and their types
OPTIONS: dict[str, tuple[type, ...]] = {
    "model": (str, type(None)),
    "truncate": (bool,),
    "truncation_direction": (str,),
    "normalize": (bool,),
    "dimensions": (int, type(None)),
    "param": (str,),
    "prompt_name": (str, type(None)),
    "prompt_role": (str, type(None)),
}
DIM, TOKENS, MAX_SEQ = "x-embedding-dim", "x-prompt-tokens", "x-model-max-seq-length"
PATH_HEADER = "x-model-path"


def encode_request(texts: list[str], options: dict[str, Any], tokens: TokenIds | None = None) -> bytes:
    """The body of ``POST /internal/embed`` (compact JSON; ``tokens``: the front's token ids of ``texts``)."""
    req: dict[str, Any] = {"texts": texts, "options": options}
    if tokens is not None:
        flat = np.concatenate(tokens.ids).astype("<i4") if tokens.ids else np.zeros(0, "<i4")
        req["tokens"] = {
            "model": tokens.model,
            "sha256": tokens.sha256,
            "lengths": [len(x) for x in tokens.ids],
            "ids": base64.b64encode(flat.tobytes()).decode("ascii"),
        }
    return orjson.dumps(req)


def decode_request(body: bytes) -> tuple[list[str], dict[str, Any], TokenIds | None]:
    """``(texts, options, tokens)`` of a body made by :func:`encode_request`.

    Raises:
        APIError: 400 ``invalid_request`` for a body not of that form (only a front sends this route).
    """
    tokens = None
    try:
        req = orjson.loads(body)
        texts, options = req["texts"], req["options"]
        ok = isinstance(texts, list) and all(isinstance(t, str) for t in texts) and isinstance(options, dict)
        ok = ok and all(k in OPTIONS and isinstance(v, OPTIONS[k]) for k, v in options.items())
        if ok and "tokens" in req:
            tokens = _token_ids(req["tokens"], len(texts))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise APIError(400, "not an internal embedding request", code="invalid_request")
    return texts, options, tokens


def _token_ids(t: dict[str, Any], n: int) -> TokenIds:
    """The :class:`TokenIds` of a request's ``tokens`` field. Raises ValueError (or KeyError, TypeError) when it is
    not of :func:`encode_request`'s form or not one list per text."""
    lengths = t["lengths"]
    if not isinstance(t["model"], str) or not isinstance(t["sha256"], str) or len(lengths) != n:
        raise ValueError("tokens: not one id list per text")
    sizes = np.asarray(lengths, dtype=np.int64)
    flat = np.frombuffer(base64.b64decode(t["ids"], validate=True), dtype="<i4")
    if sizes.ndim != 1 or (sizes < 0).any() or int(sizes.sum()) != flat.size:
        raise ValueError("tokens: lengths do not add up to the ids")
    return TokenIds(t["model"], t["sha256"], np.split(flat.astype(np.int64), np.cumsum(sizes)[:-1]))


def decode_response(body: bytes, headers: Any) -> np.ndarray:
    """The float32 ``(rows, dim)`` array of a 200 answer (``headers``: its headers, a case-insensitive mapping)."""
    dim = int(headers[DIM])
    return np.frombuffer(body, dtype="<f4").reshape(-1, dim) if dim else np.zeros((0, 0), np.float32)


class InternalFirst:
    """The core's ASGI app behind fronts: ``POST /internal/embed`` answered here (module docstring), every other
    request (the fronts' proxied ones, lifespan) passed to ``app``, the service app. Its calls are counted in the app's
    ``embed_requests_total`` / ``embed_request_duration_seconds`` under the route ``/internal/embed``."""

    def __init__(self, app: FastAPI, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI application call (ASGI spec, "Applications")."""
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST":
            await self._embed(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _embed(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0, status = time.perf_counter(), 499
        try:
            chunks: list[bytes] = []
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                chunks.append(msg.get("body", b""))
                if not msg.get("more_body", False):
                    break
            try:
                rows, headers = await self._encoded(b"".join(chunks), receive)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                err = to_api_error(e) if not isinstance(e, APIError) else e
                if err is None:  # as the app's handler of unexpected errors: an id to quote, the details logged
                    error_id = uuid.uuid4().hex[:12]
                    log.error("error %s on POST %s", error_id, PATH, exc_info=e)
                    err = APIError(500, f"internal error (id {error_id}); see the server log", type="server_error")
                status = err.status
                await err.response()(scope, receive, send)
                return
            if rows is None:  # the front went away
                return
            status = 200
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": rows, "more_body": False})
        finally:
            self.metrics.requests.labels(PATH, "POST", str(status)).inc()
            self.metrics.request_duration.labels(PATH, "POST").observe(time.perf_counter() - t0)

    async def _encoded(self, body: bytes, receive: Receive) -> tuple[bytes | None, list[tuple[bytes, bytes]]]:
        """The rows' bytes and the answer's headers, or ``(None, [])`` when the front disconnects first (the
        encoding is then cancelled).

        Raises:
            APIError: 400 for a body not made by :func:`encode_request`, 503 before the model is loaded.
            Exception: any error of ``Embedder.encode``.
        """
        texts, options, tokens = decode_request(body)
        embedder = getattr(self.app.state, "embedder", None)
        if embedder is None:
            raise APIError(503, "service is starting", code="model_not_ready")
        work = asyncio.ensure_future(embedder.encode(texts, **options, token_ids=tokens))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if work not in done:
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return None, []
        res = work.result()
        rows = np.ascontiguousarray(res.embeddings, dtype="<f4")
        info = res.model
        headers = [
            (b"content-type", b"application/octet-stream"),
            (b"content-length", str(rows.nbytes).encode()),
            (b"x-model", info.id.encode()),
            (b"x-model-sha256", info.sha256.encode()),
            (DIM.encode(), str(rows.shape[1] if rows.ndim == 2 else 0).encode()),
            (TOKENS.encode(), str(res.prompt_tokens).encode()),
            (MAX_SEQ.encode(), str(info.max_seq_length).encode()),
            (PATH_HEADER.encode(), info.path.encode()),
        ]
        return rows.tobytes(), headers


async def _disconnected(receive: Receive) -> None:
    """Return once the peer disconnects (``http.disconnect``)."""
    while (await receive())["type"] != "http.disconnect":
        pass
