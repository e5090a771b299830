"""HTTP routes of the collections (Qdrant's names, OpenAI-shaped errors).

============================================  ==================================================
``PUT    /collections/{name}``                create ``{index, params, metric}``
``GET    /collections``                       list ``{"collections": [info, ...]}``
``GET    /collections/{name}``                info: count, index (type, params, trained), dimension, model
``DELETE /collections/{name}``                delete it and its files
``PUT    /collections/{name}/points``         upsert ``{points: [{id, text, payload}]}`` (durable on answer)
``POST   /collections/{name}/points/delete``  delete ``{ids: [...]}`` or ``{filter: {...}}``
``GET    /collections/{name}/points/{id}``    one point ``{id, text, payload}`` (``?with_vector=true``,
                                              ``?id_type=auto|int|string``; ids may contain ``/``)
``POST   /collections/{name}/search``         ``{query, top_k, filter, score_threshold, with_payload, with_text}``
                                              -> ``[{id, score, text, payload}]``
``POST   /collections/{name}/search/batch``   ``{searches: [search, ...]}`` -> ``[[hit, ...], ...]``
============================================  ==================================================

``query`` is a text (embedded with the collection's model) or a vector of the
collection's dimension. Errors: 404 ``collection_not_found`` / ``point_not_found``,
409 ``collection_exists`` / ``model_unavailable``, 413 ``too_many_points``, 422
``invalid_value`` / ``invalid_filter`` / ``wrong_dimension``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from ..embedder import ModelNotReady
from ..errors import APIError
from ..registry import ModelNotFound
from ..routes import json_response
from .collection import Collection, CollectionClosed, Hit, ModelChanged
from .filters import FilterError, parse_filter
from .manager import CollectionManager
from .vectors import query_problem

router = APIRouter(tags=["collections"])

FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=False)]
PointId = Annotated[StrictInt, Field(ge=0, le=2**64 - 1)] | Annotated[StrictStr, Field(min_length=1, max_length=512)]


class CreateCollection(BaseModel):
    """Body of ``PUT /collections/{name}``."""

    model_config = ConfigDict(extra="forbid")
    index: Literal["flat", "hnsw", "ivf_pq"] = "flat"
    params: dict[str, Any] | None = None
    metric: Literal["cosine", "dot", "l2"] = "cosine"


class PointIn(BaseModel):
    """One point to upsert: ``id`` (unsigned int or string), ``text`` (embedded), optional JSON-object ``payload``."""

    model_config = ConfigDict(extra="forbid")
    id: PointId
    text: StrictStr = Field(min_length=1)
    payload: dict[str, Any] | None = None

    @field_validator("payload")
    @classmethod
    def _plain_json(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            check_payload_values(v)
        return v


INT64 = (-(2**63), 2**63 - 1)  # what SQLite stores and filters compare as integers


def check_payload_values(v: Any, path: str = "payload") -> None:
    """Payloads are plain JSON whose numbers a filter can match: no NaN/Infinity, integers within signed 64 bits.

    Raises:
        ValueError: naming the offending path.
    """
    if isinstance(v, dict):
        for k, x in v.items():
            check_payload_values(x, f"{path}.{k}")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            check_payload_values(x, f"{path}[{i}]")
    elif isinstance(v, bool) or v is None or isinstance(v, str):
        return
    elif isinstance(v, int):
        if not INT64[0] <= v <= INT64[1]:
            raise ValueError(f"{path}: integer {v} is outside the signed 64-bit range filters can compare")
    elif isinstance(v, float):
        if not np.isfinite(v):
            raise ValueError(f"{path}: payload must be plain JSON (no NaN/Infinity)")


class UpsertPoints(BaseModel):
    """Body of ``PUT /collections/{name}/points``."""

    model_config = ConfigDict(extra="forbid")
    points: list[PointIn] = Field(min_length=1)


class DeletePoints(BaseModel):
    """Body of ``POST /collections/{name}/points/delete``: exactly one of ``ids`` and ``filter``."""

    model_config = ConfigDict(extra="forbid")
    ids: list[PointId] | None = None
    filter: Any = None

    @model_validator(mode="after")
    def _one(self) -> DeletePoints:
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give exactly one of 'ids' and 'filter'")
        return self


class SearchRequest(BaseModel):
    """One search: ``query`` (text or vector), ``top_k``, optional ``filter`` and ``score_threshold``."""

    model_config = ConfigDict(extra="forbid")
    query: Annotated[StrictStr, Field(min_length=1)] | Annotated[list[FiniteFloat], Field(min_length=1)]
    top_k: StrictInt = Field(10, ge=1)
    filter: Any = None
    score_threshold: FiniteFloat | None = None
    with_payload: StrictBool = True
    with_text: StrictBool = True


class SearchBatch(BaseModel):
    """Body of ``POST /collections/{name}/search/batch``."""

    model_config = ConfigDict(extra="forbid")
    searches: list[SearchRequest] = Field(min_length=1)


def manager_of(request: Request) -> CollectionManager:
    """``app.state.collections``, or 503 while it is not started."""
    m = getattr(request.app.state, "collections", None)
    if m is None:
        raise APIError(503, "collections are not available yet", code="not_ready")
    return m


def _closed(name: str) -> APIError:
    return APIError(404, f"collection {name!r} not found (deleted)", param="name", code="collection_not_found")


async def _embed(
    request: Request, c: Collection, texts: list[str], chunk: int, model: dict[str, Any] | None = None
) -> np.ndarray:
    """Embed ``texts`` with ``model`` (default: the model that embedded the collection): float32 ``(n, d)``.

    Raises:
        APIError: 409 ``model_unavailable`` when that exact model (name, version, sha256) is not loaded.
    """
    emb = getattr(request.app.state, "embedder", None)
    if emb is None:
        raise APIError(503, "service is starting", code="model_not_ready")
    want = model or c.model
    model_id = f"{want['name']}:{want['version']}"
    try:
        lm = emb.resolve(model_id)
    except (ModelNotFound, ModelNotReady) as e:
        raise APIError(
            409,
            f"collection {c.name!r} needs {model_id} (sha256 {want['sha256'][:12]}...), which is not loaded",
            code="model_unavailable",
        ) from e
    if lm.info.sha256 != want["sha256"]:
        raise APIError(
            409,
            f"loaded {model_id} has sha256 {lm.info.sha256[:12]}..., the collection needs {want['sha256'][:12]}...",
            code="model_unavailable",
        )
    parts = []
    for i in range(0, len(texts), chunk):
        res = await emb.encode(texts[i : i + chunk], model=lm, param="points")
        parts.append(res.embeddings)
    return np.concatenate(parts).astype(np.float32, copy=False)


def _hit_json(h: Hit, with_payload: bool, with_text: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"id": h.id, "score": h.score}
    if with_text:
        d["text"] = h.text
    if with_payload:
        d["payload"] = h.payload
    return d


# --- collections -------------------------------------------------------------------------------------------------
@router.put("/collections/{name}")
async def create_collection(name: str, body: CreateCollection, request: Request) -> Response:
    """Create a collection embedded by the active model; answers its info."""
    m = manager_of(request)
    emb = getattr(request.app.state, "embedder", None)
    if emb is None:
        raise APIError(503, "service is starting", code="model_not_ready")
    info = emb.resolve(None).info
    model = {"name": info.name, "version": info.version, "sha256": info.sha256}
    c = await m.create(name, body.index, body.params, body.metric, model, info.dimension)
    return json_response(c.info())


@router.get("/collections")
async def list_collections(request: Request) -> Response:
    """``{"collections": [info, ...]}`` sorted by name."""
    m = manager_of(request)
    return json_response({"collections": [c.info() for _, c in sorted(m.collections.items())]})


@router.get("/collections/{name}")
async def get_collection(name: str, request: Request) -> Response:
    """Count, index type/params/trained, dimension, metric, model (name, version, sha256), sequence."""
    return json_response(manager_of(request).get(name).info())


@router.delete("/collections/{name}")
async def delete_collection(name: str, request: Request) -> Response:
    """Delete the collection and its files."""
    await manager_of(request).delete(name)
    return json_response({"deleted": True, "name": name})


# --- points ---------------------------------------------------------------------------------------------------------
@router.put("/collections/{name}/points")
async def upsert_points(name: str, body: UpsertPoints, request: Request) -> Response:
    """Embed and upsert points; answers once the write is durable (SQLite commit, fsynced) and searchable."""
    m = manager_of(request)
    c = m.get(name)
    if len(body.points) > m.settings.max_points_per_request:
        raise APIError(
            413,
            f"{len(body.points)} points in one request; the maximum is {m.settings.max_points_per_request}",
            param="points",
            code="too_many_points",
        )
    texts = [p.text for p in body.points]
    for attempt in range(_RETRIES):
        # while a re-embedding runs the texts are embedded by both models and written to both
        model, shadow = dict(c.model), c.shadow
        smodel = dict(shadow.model) if shadow is not None else None
        vectors = await _embed(request, c, texts, m.settings.embed_chunk, model=model)
        svectors = await _embed(request, c, texts, m.settings.embed_chunk, model=smodel) if smodel else None
        try:
            seq = await m.run(
                c.upsert,
                [p.id for p in body.points],
                texts,
                [p.payload for p in body.points],
                vectors,
                model=model,
                shadow_model=smodel,
                shadow_vectors=svectors,
            )
            break
        except CollectionClosed:
            raise _closed(name) from None
        except ModelChanged as e:
            if attempt == _RETRIES - 1:
                raise APIError(
                    503,
                    f"collection {name!r} changed model during the write; retry ({e})",
                    code="model_changed",
                    headers={"Retry-After": "1"},
                ) from e
    # a repeated id is written once (the last occurrence wins): count the points that changed
    return json_response({"status": "completed", "upserted": len({p.id for p in body.points}), "sequence": seq})


@router.post("/collections/{name}/points/delete")
async def delete_points(name: str, body: DeletePoints, request: Request) -> Response:
    """Delete points by ``ids`` or by ``filter``; answers ``{deleted, sequence}`` once durable."""
    m = manager_of(request)
    c = m.get(name)
    conditions = None
    if body.filter is not None:
        try:
            conditions = parse_filter(body.filter)
        except FilterError as e:
            raise APIError(422, str(e), param="filter", code="invalid_filter") from e
    try:
        n, seq = await m.run(c.delete, body.ids, conditions)
    except CollectionClosed:
        raise _closed(name) from None
    return json_response({"status": "completed", "deleted": n, "sequence": seq})


@router.get("/collections/{name}/points/{point_id:path}")
async def get_point(
    name: str,
    point_id: str,
    request: Request,
    with_vector: bool = False,
    id_type: Literal["auto", "int", "string"] = "auto",
) -> Response:
    """One point. Any string id is addressable (``/`` included: the rest of the path is the id). With
    ``id_type=auto`` an id in canonical decimal form (``7``, not ``007``) is looked up as an unsigned integer
    first, then as a string; ``id_type=string`` or ``int`` picks one (a string id ``"7"`` beside an integer 7)."""
    m = manager_of(request)
    c = m.get(name)
    canonical = point_id.isascii() and point_id.isdigit() and str(int(point_id)) == point_id
    if id_type == "int" and not canonical:
        raise APIError(422, f"{point_id!r} is not an unsigned integer id", param="id", code="invalid_value")
    candidates: list[int | str] = {
        "auto": [int(point_id), point_id] if canonical else [point_id],
        "int": [int(point_id)] if canonical else [],
        "string": [point_id],
    }[id_type]
    try:
        for pid in candidates:
            p = await m.run(c.get, pid, with_vector)
            if p is not None:
                return json_response(p)
    except CollectionClosed:
        raise _closed(name) from None
    raise APIError(404, f"point {point_id!r} not found in collection {name!r}", param="id", code="point_not_found")


# --- search -------------------------------------------------------------------------------------------------------
_RETRIES = 3  # embeddings made just before a re-embedding swap are redone with the new model


async def _run_searches(
    request: Request, name: str, searches: list[SearchRequest], param: str
) -> list[list[dict[str, Any]]]:
    for attempt in range(_RETRIES):
        try:
            return await _run_searches_once(request, name, searches, param)
        except ModelChanged as e:
            if attempt == _RETRIES - 1:
                raise APIError(
                    503,
                    f"collection {name!r} changed model during the search; retry ({e})",
                    code="model_changed",
                    headers={"Retry-After": "1"},
                ) from e
    raise AssertionError("unreachable")


async def _run_searches_once(
    request: Request, name: str, searches: list[SearchRequest], param: str
) -> list[list[dict[str, Any]]]:
    m = manager_of(request)
    c = m.get(name)
    model = dict(c.model)
    d = c.spec.dimension
    plans = []
    texts: list[str] = []
    for i, s in enumerate(searches):
        where = f"{param}[{i}]" if param == "searches" else ""
        pre = f"{where}." if where else ""
        if s.top_k > m.settings.max_top_k:
            raise APIError(
                422, f"top_k must be at most {m.settings.max_top_k}", param=f"{pre}top_k", code="invalid_value"
            )
        try:
            conditions = parse_filter(s.filter) if s.filter is not None else None
        except FilterError as e:
            raise APIError(422, str(e), param=f"{pre}filter", code="invalid_filter") from e
        if isinstance(s.query, str):
            plans.append((s, conditions, len(texts)))
            texts.append(s.query)
        else:
            v = np.asarray(s.query, dtype=np.float32)
            if len(v) != d:
                raise APIError(
                    422,
                    f"query vector has dimension {len(v)}; collection {name!r} has {d}",
                    param=f"{pre}query",
                    code="wrong_dimension",
                )
            problem = query_problem(v, c.spec.metric)
            if problem is not None:
                raise APIError(422, problem, param=f"{pre}query", code="invalid_value")
            plans.append((s, conditions, v))
    qvecs = await _embed(request, c, texts, m.settings.embed_chunk, model=model) if texts else None

    def _search_all() -> list[list[dict[str, Any]]]:
        out = []
        for s, conditions, q in plans:
            vec = qvecs[q] if isinstance(q, int) else q
            hits = c.search(
                vec[None, :], s.top_k, conditions, s.score_threshold, s.with_payload, s.with_text, model=model
            )[0]
            out.append([_hit_json(h, s.with_payload, s.with_text) for h in hits])
        return out

    try:
        return await m.run(_search_all)
    except CollectionClosed:
        raise _closed(name) from None


@router.post("/collections/{name}/search")
async def search(name: str, body: SearchRequest, request: Request) -> Response:
    """``[{id, score, text, payload}]``, best first: the top_k points (among those matching the filter)."""
    return json_response((await _run_searches(request, name, [body], "query"))[0])


@router.post("/collections/{name}/search/batch")
async def search_batch(name: str, body: SearchBatch, request: Request) -> Response:
    """One result list per search, in order."""
    m = manager_of(request)
    if len(body.searches) > m.settings.max_batch_searches:
        raise APIError(
            413,
            f"{len(body.searches)} searches in one request; the maximum is {m.settings.max_batch_searches}",
            param="searches",
            code="too_many_searches",
        )
    return json_response(await _run_searches(request, name, body.searches, "searches"))
