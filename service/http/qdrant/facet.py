"""Value counts of a payload key through Qdrant's API (Qdrant API reference, https://api.qdrant.tech/api-reference,
"Points": ``POST /collections/{collection_name}/facet`` -> ``{hits: [{value, count}]}``).

The ``limit`` (default 10) most frequent values at ``key`` (dotted keys reach into objects) among the points matching
``filter``, most frequent first, ties in value order (booleans, then integers, then strings). As in Qdrant, string,
integer and boolean values count; an array counts a point once for each distinct such element; other values and
points without the key do not count; a string that reads as a UUID counts in its hyphenated form, as Qdrant's. Counts are exact (``exact`` is accepted): the matching points' payloads are read
a page at a time through the collection service's scroll, so the cost grows with the number of matching points (no
payload index is kept), and writes made while it reads may or may not be counted, as for a scroll.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from fastapi import APIRouter, Request, Response

from service.http.kit import JSONRoute
from service.http.qdrant.envelope import PREFIX, Service, ok
from service.http.qdrant.filters import translate
from service.http.qdrant.models import FacetRequest
from service.http.qdrant.points import no_shard_key
from service.http.qdrant.results import values_at

router = APIRouter(prefix=PREFIX, tags=["qdrant"], route_class=JSONRoute)
DEFAULT_LIMIT = 10


def _uuid_form(v: tuple[int, Any]) -> tuple[int, Any]:
    """A string value that reads as a UUID (32 hex digits, hyphenated, braced or ``urn:uuid:``) in its hyphenated
    lowercase form, as Qdrant reports it; other values as they are."""
    if v[0] == 2:
        try:
            return 2, str(uuid.UUID(v[1]))
        except ValueError:
            pass
    return v


@router.post("/collections/{collection_name}/facet")
async def facet(collection_name: str, body: FacetRequest, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/facet`` -> ``{hits: [{value, count}]}`` (module
    docstring). Errors: 404, 422 (a filter that does not map)."""
    no_shard_key(body)
    where = translate(body.filter)
    counts: Counter[tuple[int, Any]] = Counter()
    page, start = min(svc.settings.max_points_per_request, svc.settings.max_top_k), None
    while True:
        points, start = await svc.scroll(collection_name, start, page, where)
        for p in points:
            counts.update(set(_uuid_form(v) for v in values_at(p.get("payload"), body.key)))
        if start is None:
            break
    best = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: body.limit or DEFAULT_LIMIT]
    return ok(request, {"hits": [{"value": value, "count": n} for (_, value), n in best]})
