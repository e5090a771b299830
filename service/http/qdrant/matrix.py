"""Qdrant's distance matrix API (Qdrant API reference, "Search matrix pairs" and "Search matrix offsets"):
``POST /collections/{collection_name}/points/search/matrix/pairs`` and ``.../offsets`` with ``{filter, sample
(default 10), limit (default 3), using}``, translated onto :func:`service.collections.matrix.distance_matrix`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, StrictInt

from service.collections.matrix import distance_matrix
from service.collections.service import CollectionService
from service.http.kit import JSONRoute
from service.http.qdrant.envelope import PREFIX, Service, ok
from service.http.qdrant.filters import translate
from service.http.qdrant.points import no_shard_key

router = APIRouter(prefix=PREFIX, tags=["qdrant"], route_class=JSONRoute)
DEFAULT_SAMPLE, DEFAULT_LIMIT = 10, 3


class SearchMatrixRequest(BaseModel):
    """Body of both routes (Qdrant's ``SearchMatrixRequest``)."""

    model_config = ConfigDict(extra="forbid")
    filter: dict[str, Any] | None = None
    sample: StrictInt | None = None
    limit: StrictInt | None = None
    using: str | None = None
    shard_key: Any = None


async def _matrix(svc: CollectionService, name: str, body: SearchMatrixRequest) -> tuple[list, list]:
    no_shard_key(body)
    sample, limit = body.sample or DEFAULT_SAMPLE, body.limit or DEFAULT_LIMIT
    return await distance_matrix(
        svc.searcher, name, sample, limit, translate(body.filter), body.using, svc.response_budget()
    )


@router.post("/collections/{collection_name}/points/search/matrix/pairs")
async def matrix_pairs(collection_name: str, body: SearchMatrixRequest, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST .../points/search/matrix/pairs`` -> ``{pairs: [{a, b, score}]}``, the sampled
    points in point order, each with its neighbours best first. Errors: 404, 422 (sample, limit, vector, filter)."""
    ids, hits = await _matrix(svc, collection_name, body)
    return ok(request, {"pairs": [{"a": i, "b": h.id, "score": h.score} for i, hs in zip(ids, hits) for h in hs]})


@router.post("/collections/{collection_name}/points/search/matrix/offsets")
async def matrix_offsets(collection_name: str, body: SearchMatrixRequest, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST .../points/search/matrix/offsets`` -> ``{offsets_row, offsets_col, scores,
    ids}``: a sparse matrix over ``ids`` (the sampled points in point order). Errors: as for pairs."""
    ids, hits = await _matrix(svc, collection_name, body)
    pos = {(type(i), i): k for k, i in enumerate(ids)}
    cells = [(r, pos[(type(h.id), h.id)], h.score) for r, hs in enumerate(hits) for h in hs]
    return ok(
        request,
        {
            "offsets_row": [r for r, _, _ in cells],
            "offsets_col": [c for _, c, _ in cells],
            "scores": [s for _, _, s in cells],
            "ids": ids,
        },
    )
