"""Collection aliases through Qdrant's API, translated onto ``service.collections.aliases``.

Qdrant API reference (https://api.qdrant.tech/api-reference), section "Aliases": ``POST /collections/aliases``
(``update_collection_aliases``: create, delete and rename actions in order, all or none), ``GET /aliases``
(``get_aliases``), ``GET /collections/{collection_name}/aliases`` (``get_collection_aliases``). Every collection
route accepts an alias for ``collection_name``; deleting a collection by an alias is refused (404), as creating a
collection or an alias with a name the other already has (409).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.http.alias_actions import ChangeAliases
from service.http.kit import JSONRoute
from service.http.qdrant.envelope import PREFIX, WRITES, Service, ok

router = APIRouter(prefix=PREFIX, tags=["qdrant"], route_class=JSONRoute)


@router.post("/collections/aliases", dependencies=WRITES)
async def update_aliases(request: Request, body: ChangeAliases, svc: Service, timeout: int | None = None) -> Response:
    """Qdrant's "Update aliases of the collections": ``true`` once applied (``timeout`` has no effect)."""
    await svc.backend.update_aliases(body.plain())
    return ok(request, True)


@router.get("/aliases")
async def list_aliases(request: Request, svc: Service) -> Response:
    """Qdrant's "List collections aliases": ``{aliases: [{alias_name, collection_name}]}``."""
    return ok(request, {"aliases": svc.backend.aliases.listing()})


@router.get("/collections/{collection_name}/aliases")
async def collection_aliases(request: Request, collection_name: str, svc: Service) -> Response:
    """Qdrant's "List aliases for collection"."""
    c = await svc.collection(collection_name)
    return ok(request, {"aliases": svc.backend.aliases.listing(c.name)})
