"""``POST /internal/embed``: the embedding call of a front process (``service.front``) to the core, in a compact form.

With ``api_workers`` > 1 (``service.supervisor``) the client's ``POST /v1/embeddings`` and ``POST /embed`` are parsed,
validated and answered by front processes; the core, which owns the models and their batchers, gets only this
route, over a private Unix socket (the route is mounted on the core's app by the supervisor, never on the public
port; a front refuses to proxy ``/internal/``). Its event loop then neither parses the client's JSON nor encodes
the JSON (or base64) answer.

Request: ``application/json`` ``{"texts": [str], "options": {...}}`` where ``options`` are keyword arguments of
``Embedder.encode`` (:data:`OPTIONS`; the front has already validated them with the request models of
``service.http.inference.schemas``). JSON rather than a binary framing: orjson parses a list of strings as fast as
the texts could be sliced out of a length-prefixed buffer, and the middleware's body checks keep applying unchanged
(orjson writes non-ASCII as UTF-8, so the surrogate scan has no ``\\u`` escape to look at).

Response 200: ``application/octet-stream``, the embeddings as little-endian float32 bytes, ``rows x dim``
(C order), with the headers ``X-Model`` (``name:version``), ``X-Model-Sha256``, :data:`DIM`, :data:`TOKENS`,
:data:`MAX_SEQ`. Raw bytes, not JSON: the core copies the array once (``tobytes``) and the front reads it back with
``numpy.frombuffer`` at no cost. Any error is the core's own JSON error answer (status, body, headers), which the
front passes on unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response

from service.http.errors import APIError
from service.http.kit import embedder_of

router = APIRouter()

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


def encode_request(texts: list[str], options: dict[str, Any]) -> bytes:
    """The body of ``POST /internal/embed`` (compact JSON)."""
    return orjson.dumps({"texts": texts, "options": options})


def decode_request(body: bytes) -> tuple[list[str], dict[str, Any]]:
    """``(texts, options)`` of a body made by :func:`encode_request`.

    Raises:
        APIError: 400 ``invalid_request`` for a body not of that form (only a front sends this route).
    """
    try:
        req = orjson.loads(body)
        texts, options = req["texts"], req["options"]
        ok = isinstance(texts, list) and all(isinstance(t, str) for t in texts) and isinstance(options, dict)
        ok = ok and all(k in OPTIONS and isinstance(v, OPTIONS[k]) for k, v in options.items())
    except (orjson.JSONDecodeError, KeyError, TypeError):
        ok = False
    if not ok:
        raise APIError(400, "not an internal embedding request", code="invalid_request")
    return texts, options


def decode_response(body: bytes, headers: Any) -> np.ndarray:
    """The float32 ``(rows, dim)`` array of a 200 answer (``headers``: its headers, a case-insensitive mapping)."""
    dim = int(headers[DIM])
    return np.frombuffer(body, dtype="<f4").reshape(-1, dim) if dim else np.zeros((0, 0), np.float32)


@router.post(PATH, include_in_schema=False)
async def internal_embed(request: Request) -> Response:
    """Embed the texts of a front's request (module docstring); errors are those of ``Embedder.encode``."""
    texts, options = decode_request(await request.body())
    res = await embedder_of(request).encode(texts, **options)
    rows = np.ascontiguousarray(res.embeddings, dtype="<f4")
    info = res.model
    headers = {
        "X-Model": info.id,
        "X-Model-Sha256": info.sha256,
        DIM: str(rows.shape[1] if rows.ndim == 2 else 0),
        TOKENS: str(res.prompt_tokens),
        MAX_SEQ: str(info.max_seq_length),
    }
    return Response(rows.tobytes(), media_type="application/octet-stream", headers=headers)
