"""The OpenAPI contract: what every operation answers, in one table.

Routes build their bodies with :func:`service.http.kit.json_response` (no per-route ``response_model``), so the
documented success bodies and error answers live here: :data:`OPERATIONS` maps ``(method, path)`` to the success
schema and the error statuses the operation can answer; :func:`document` attaches them to the app's routes
(every error uses :class:`ErrorBody`, the OpenAI shape of :mod:`service.http.errors`). A test fails when a route is
missing from the table, and the fuzz gate checks live responses against what is written here.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, create_model

from service.http.inference.rerank import RERANK_OPERATIONS
from service.http.qdrant.openapi import (
    QdrantFacet,
    QdrantGroups,
    QdrantMatrixOffsets,
    QdrantMatrixPairs,
    QdrantPoints,
    QdrantRecord,
    QdrantScored,
    QdrantScroll,
    QdrantUpdate,
    qdrant_envelope,
)

_q = qdrant_envelope


class ErrorDetail(BaseModel):
    """The ``error`` object of an error body, as OpenAI's API answers errors."""

    message: str = Field(description="what was wrong, for a person")
    type: str = Field(description="error class, e.g. invalid_request_error, rate_limit_error")
    param: str | None = Field(None, description="the request field at fault, if any")
    code: str | None = Field(None, description="stable machine-readable code, e.g. input_too_long")


class ErrorBody(BaseModel):
    """Every 4xx/5xx body: ``{"error": {message, type, param, code}}`` (OpenAI's shape)."""

    error: ErrorDetail


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class EmbeddingItem(BaseModel):
    """One embedding, at ``index`` in the request's input order (OpenAI API reference, "The embedding object")."""

    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 little-endian float32")


class Usage(BaseModel):
    """Tokens of the inputs, after truncation, special tokens included; ``total_tokens`` equals ``prompt_tokens``."""

    prompt_tokens: int
    total_tokens: int


class TeiToken(BaseModel):
    """One token of ``POST /tokenize`` (TEI API reference, ``SimpleToken``): a special token's own string with no
    offsets, else the input's characters ``[start, stop)`` (of the prompted input when a prompt applies)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class EmbeddingsResponse(BaseModel):
    """Answer of ``POST /v1/embeddings`` (OpenAI API reference, "Create embeddings"): one L2-normalised
    embedding per input; ``model`` and ``model_version`` name the model that made them."""

    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    model_version: str
    usage: Usage


class SimilarityResponse(BaseModel):
    """Answer of ``POST /similarity``: one cosine score per sentence or pair, in order, and the model's name."""

    scores: list[float] = Field(description="cosine similarity per sentence or pair")
    model: str


class Status(_Open):
    """Answer of ``/health`` (``ok``) and ``/ready`` (``ready``, with the active model's name)."""

    status: str


class ModelList(_Open):
    """Answer of ``GET /v1/models`` (OpenAI API reference, "List models"): the loaded models, each with its
    ``version``, ``active`` flag and ``manifest``; ``available`` lists every artifact in the models directory."""

    object: Literal["list"]
    data: list[dict[str, Any]]


class CollectionInfo(_Open):
    """A collection: point ``count``, vector ``dimension``, ``metric`` (cosine, dot, l2), ``index`` (type, params,
    trained), the ``model`` that embedded it, the last re-embedding's progress and the latest write ``sequence``."""

    name: str
    count: int
    dimension: int
    metric: str
    index: dict[str, Any]


class CollectionList(BaseModel):
    """Answer of ``GET /collections``: every collection's info, sorted by name."""

    collections: list[CollectionInfo]


class WriteResult(_Open):
    """Answer of a points write: ``completed`` once durable and searchable; ``sequence`` is the write's number (pass it
    as ``after_sequence`` to read your writes on any replica), with ``upserted`` or ``deleted`` counts."""

    status: Literal["completed"]
    sequence: int


class Point(_Open):
    """A stored point: ``id``, ``text``, ``payload``, and ``vector`` when ``with_vector`` was asked."""

    id: int | str
    text: str
    payload: dict[str, Any] | None


class ScrollPage(BaseModel):
    """Answer of ``POST /collections/{name}/points/scroll``: one page of points in stored-id order."""

    points: list[Point]
    next: int | str | None = Field(description="the start of the next page; null on the last")


class Count(BaseModel):
    """Answer of ``POST /collections/{name}/points/count``: the points matching the filter, counted exactly."""

    count: int


class Hit(_Open):
    """A search result: point ``id`` and ``score`` (cosine/dot similarity, higher is better; l2 distance, lower is
    better), with ``text`` and ``payload`` unless turned off."""

    id: int | str
    score: float


class SnapshotDescription(BaseModel):
    """A collection snapshot (Qdrant API reference, ``SnapshotDescription``): file ``name``, ``creation_time``
    (ISO 8601, UTC), ``size`` in bytes, ``checksum`` (SHA-256 hex)."""

    name: str
    creation_time: str | None
    size: int
    checksum: str | None


class SnapshotList(BaseModel):
    """Answer of ``GET /collections/{name}/snapshots``: the collection's snapshots, oldest first."""

    snapshots: list[SnapshotDescription]


# the answers of a wait=false snapshot operation (accepted, running in the background): native and Qdrant's
Accepted = create_model("Accepted", status=(Literal["accepted"], ...))
QdrantAccepted = create_model(
    "QdrantAccepted", result=(None, None), status=(Literal["accepted"], ...), time=(float, ...)
)


BINARY = "binary"  # the snapshot file a download answers (``application/octet-stream``)
QDRANT_UPDATE = _q(QdrantUpdate, "QdrantUpdateResponse")
ALIASES = dict[str, list[dict[str, str]]]  # {aliases: [{alias_name, collection_name}]}
QDRANT_COLLECTION = "/qdrant/collections/{collection_name}"

#: statuses every operation with a body can answer: malformed body, auth, size, media type, validation, timeout
COMMON = (400, 401, 413, 415, 422, 503)
EMBED = (*COMMON, 404, 429)
COLLECTION = (*COMMON, 404, 409, 429)
ADMIN = (*COMMON, 403, 404, 409)
READ = (401, 404, 422, 503)  # a GET of something named: auth, missing, a bad parameter, unavailable
RECOVER = (*COLLECTION, 403)  # recovery from a location needs an admin key
UPLOAD = (*COLLECTION, 408)  # an upload silent for collections_snapshot_idle_timeout_s
TOKENIZE = (*COMMON, 404)

#: (method, path) -> (success status, success body schema (None: plain text), error statuses)
OPERATIONS: dict[tuple[str, str], tuple[int, Any, tuple[int, ...]]] = {
    ("POST", "/v1/embeddings"): (200, EmbeddingsResponse, EMBED),
    ("POST", "/embeddings"): (200, EmbeddingsResponse, EMBED),
    ("POST", "/embed"): (200, list[list[float]], EMBED),
    ("POST", "/"): (200, list[list[float]], EMBED),
    ("POST", "/tokenize"): (200, list[list[TeiToken]], TOKENIZE),
    ("POST", "/decode"): (200, list[str], TOKENIZE),
    ("POST", "/similarity"): (200, SimilarityResponse | list[float], EMBED),  # TEI's form: the bare list
    **RERANK_OPERATIONS,  # /rerank, /v1/rerank, /v2/rerank (service.http.inference.rerank)
    ("GET", "/v1/models"): (200, ModelList, (401, 503)),
    ("GET", "/info"): (200, _Open, (401, 503)),
    **dict.fromkeys([("GET", "/health"), ("GET", "/"), ("GET", "/ping")], (200, Status, ())),
    ("GET", "/ready"): (200, Status, (503,)),
    ("GET", "/metrics"): (200, None, ()),
    ("POST", "/admin/models/reload"): (200, _Open, ADMIN),
    **{("POST", f"/admin/models/{{name}}/{a}"): (200, _Open, ADMIN) for a in ("load", "activate", "unload")},
    ("PUT", "/collections/{name}"): (200, CollectionInfo, COLLECTION),
    ("GET", "/collections"): (200, CollectionList, (401, 503)),
    ("GET", "/collections/{name}"): (200, CollectionInfo, READ),
    ("DELETE", "/collections/{name}"): (200, _Open, (401, 404, 409, 422, 503)),
    ("PUT", "/collections/{name}/points"): (200, WriteResult, COLLECTION),
    ("POST", "/collections/{name}/points/delete"): (200, WriteResult, COLLECTION),
    ("GET", "/collections/{name}/points/{point_id}"): (200, Point, READ),
    ("POST", "/collections/{name}/points/scroll"): (200, ScrollPage, COLLECTION),
    ("POST", "/collections/{name}/points/count"): (200, Count, COLLECTION),
    ("POST", "/collections/{name}/search"): (200, list[Hit], COLLECTION),
    ("POST", "/collections/{name}/search/batch"): (200, list[list[Hit]], COLLECTION),
    ("POST", "/collections/{name}/snapshots"): (200, SnapshotDescription, COLLECTION),
    ("GET", "/collections/{name}/snapshots"): (200, SnapshotList, READ),
    ("GET", "/collections/{name}/snapshots/{snapshot_name}"): (200, BINARY, READ),
    ("DELETE", "/collections/{name}/snapshots/{snapshot_name}"): (200, _Open, READ),
    ("PUT", "/collections/{name}/snapshots/recover"): (200, CollectionInfo, RECOVER),
    ("POST", "/collections/{name}/snapshots/upload"): (200, CollectionInfo, UPLOAD),
    ("POST", "/collections/aliases"): (200, _Open, COLLECTION),
    ("GET", "/aliases"): (200, _Open, (401, 503)),
    ("GET", "/collections/{name}/aliases"): (200, _Open, READ),
    **dict.fromkeys(
        [
            ("PUT", "/collections/{name}/vectors/{vector}"),
            ("DELETE", "/collections/{name}/vectors/{vector}"),
            ("PUT", "/collections/{name}/payload-indexes/{key}"),
            ("DELETE", "/collections/{name}/payload-indexes/{key}"),
        ],
        (200, CollectionInfo, COLLECTION),
    ),
    ("GET", "/qdrant"): (200, _Open, (401,)),
    ("GET", "/qdrant/collections"): (200, _q(dict[str, list[dict[str, str]]], "QdrantCollections"), (401, 503)),
    ("PUT", QDRANT_COLLECTION): (200, _q(bool, "QdrantCreated"), COLLECTION),
    ("GET", QDRANT_COLLECTION): (200, _q(dict[str, Any], "QdrantCollectionInfo"), READ),
    ("DELETE", QDRANT_COLLECTION): (200, _q(bool, "QdrantDeleted"), (401, 409, 422, 503)),
    ("PATCH", QDRANT_COLLECTION): (200, _q(bool, "QdrantUpdated"), COLLECTION),
    ("GET", f"{QDRANT_COLLECTION}/exists"): (200, _q(dict[str, bool], "QdrantExists"), (401, 422, 503)),
    ("PUT", f"{QDRANT_COLLECTION}/index"): (200, QDRANT_UPDATE, COLLECTION),
    ("DELETE", f"{QDRANT_COLLECTION}/index/{{field_name}}"): (200, QDRANT_UPDATE, COLLECTION),
    **dict.fromkeys(
        [
            ("PUT", f"{QDRANT_COLLECTION}/vectors/{{vector_name}}"),
            ("DELETE", f"{QDRANT_COLLECTION}/vectors/{{vector_name}}"),
        ],
        (200, QDRANT_UPDATE, COLLECTION),
    ),
    ("PUT", f"{QDRANT_COLLECTION}/points"): (200, QDRANT_UPDATE, COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points"): (200, _q(list[QdrantRecord], "QdrantRecords"), COLLECTION),
    ("GET", f"{QDRANT_COLLECTION}/points/{{point_id}}"): (200, _q(QdrantRecord, "QdrantRecordResponse"), READ),
    ("POST", f"{QDRANT_COLLECTION}/points/delete"): (200, QDRANT_UPDATE, COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/payload"): (200, QDRANT_UPDATE, COLLECTION),
    ("PUT", f"{QDRANT_COLLECTION}/points/payload"): (200, QDRANT_UPDATE, COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/payload/delete"): (200, QDRANT_UPDATE, COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/payload/clear"): (200, QDRANT_UPDATE, COLLECTION),
    ("PUT", f"{QDRANT_COLLECTION}/points/vectors"): (200, QDRANT_UPDATE, COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/vectors/delete"): (200, QDRANT_UPDATE, COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/batch"): (200, _q(list[QdrantUpdate], "QdrantBatchUpdate"), COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/scroll"): (200, _q(QdrantScroll, "QdrantScrollResponse"), COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/count"): (200, _q(dict[str, int], "QdrantCount"), COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/query"): (200, _q(QdrantPoints, "QdrantQueryResponse"), COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/query/batch"): (200, _q(list[QdrantPoints], "QdrantQueryBatch"), COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/query/groups"): (200, _q(QdrantGroups, "QdrantQueryGroups"), COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/facet"): (200, _q(QdrantFacet, "QdrantFacetResponse"), COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/snapshots"): (200, _q(SnapshotDescription, "QdrantSnapshot"), COLLECTION),
    ("GET", f"{QDRANT_COLLECTION}/snapshots"): (200, _q(list[SnapshotDescription], "QdrantSnapshots"), READ),
    ("GET", f"{QDRANT_COLLECTION}/snapshots/{{snapshot_name}}"): (200, BINARY, READ),
    ("DELETE", f"{QDRANT_COLLECTION}/snapshots/{{snapshot_name}}"): (200, _q(bool, "QdrantSnapshotDeleted"), READ),
    ("PUT", f"{QDRANT_COLLECTION}/snapshots/recover"): (200, _q(bool, "QdrantRecovered"), RECOVER),
    ("POST", f"{QDRANT_COLLECTION}/snapshots/upload"): (200, _q(bool, "QdrantUploaded"), UPLOAD),
    ("POST", "/qdrant/collections/aliases"): (200, _q(bool, "QdrantAliasesUpdated"), COLLECTION),
    ("GET", "/qdrant/aliases"): (200, _q(ALIASES, "QdrantAliases"), (401, 503)),
    ("GET", f"{QDRANT_COLLECTION}/aliases"): (200, _q(ALIASES, "QdrantCollectionAliases"), READ),
    ("POST", f"{QDRANT_COLLECTION}/points/search"): (200, _q(list[QdrantScored], "QdrantSearch"), COLLECTION),
    ("POST", f"{QDRANT_COLLECTION}/points/search/batch"): (
        200,
        _q(list[list[QdrantScored]], "QdrantSearchBatch"),
        COLLECTION,
    ),
    ("POST", f"{QDRANT_COLLECTION}/points/search/matrix/pairs"): (
        200,
        _q(QdrantMatrixPairs, "QdrantPairs"),
        COLLECTION,
    ),
    ("POST", f"{QDRANT_COLLECTION}/points/search/matrix/offsets"): (
        200,
        _q(QdrantMatrixOffsets, "QdrantOffsets"),
        COLLECTION,
    ),
}

_DESCRIPTIONS = {
    400: "malformed HTTP request (an invalid Content-Length header)",
    401: "missing or wrong API key",
    403: "the key lacks admin rights (the admin API, a snapshot recovery from a location), or the admin API is disabled",
    408: "the upload stopped sending for collections_snapshot_idle_timeout_s",
    404: "no such model, collection or point",
    409: "conflict: exists already, in use, or the collection's model is not loaded",
    413: "body, batch or input too large",
    415: "the body is not application/json",
    422: "invalid request (the message says which field and why)",
    429: "queue full; retry after Retry-After seconds",
    500: "internal error; the body carries an error id to quote",
    503: "starting, draining, or past request_timeout_s",
}


def _route_key(route: APIRoute, method: str) -> tuple[str, str]:
    return method, re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)  # "{point_id:anypath}" -> "{point_id}"


def document(router: APIRouter, error_model: type[BaseModel] = ErrorBody) -> APIRouter:
    """Attach :data:`OPERATIONS` to ``router``'s routes (call before mounting it); returns the router. Errors are
    documented with ``error_model`` (:class:`ErrorBody`, or :class:`QdrantError` for the Qdrant surface).

    Raises:
        KeyError: a route has no entry in :data:`OPERATIONS` (document it there).
    """
    for route in router.routes:
        if not isinstance(route, APIRoute):
            continue
        for method in route.methods:
            status, schema, errors = OPERATIONS[_route_key(route, method)]
            ok: dict[str, Any] = {"description": "success"}
            if schema is None:
                ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
                route.response_class = PlainTextResponse
            elif schema == BINARY:
                ok["content"] = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
            else:
                ok["model"] = schema
            responses: dict[int | str, Any] = {status: ok}
            if route.path.endswith(("/snapshots/recover", "/snapshots", "/snapshots/upload")) and method != "GET":
                responses[202] = {
                    "model": QdrantAccepted if route.path.startswith("/qdrant") else Accepted,
                    "description": "wait=false: accepted, running in the background",
                }
            for code in (*errors, 500):
                responses[code] = {"model": error_model, "description": _DESCRIPTIONS[code]}
            route.responses = responses
    return router
