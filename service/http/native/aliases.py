"""HTTP routes of collection aliases (Qdrant's names and bodies; :mod:`.aliases` has the semantics).

====================================  ==========================================================================
``POST /collections/aliases``         ``{actions: [{create_alias: {collection_name, alias_name}} | {delete_alias:
                                      {alias_name}} | {rename_alias: {old_alias_name, new_alias_name}}, ...]}``:
                                      applied in order, all or none -> ``{"status": "completed"}``
``GET  /aliases``                     ``{"aliases": [{alias_name, collection_name}, ...]}``
``GET  /collections/{name}/aliases``  the same, of one collection
====================================  ==========================================================================

Errors: 404 ``collection_not_found`` / ``alias_not_found``, 409 ``collection_exists`` (an alias named like a
collection), 422 ``invalid_value``.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from service.http.alias_actions import ChangeAliases
from service.http.deps import WRITES, Service
from service.http.kit import JSONRoute, json_response

router = APIRouter(tags=["collections"], route_class=JSONRoute)


@router.post("/collections/aliases", dependencies=WRITES)
async def update_aliases(body: ChangeAliases, svc: Service) -> Response:
    """Apply the alias actions in order, all or none."""
    await svc.backend.update_aliases(body.plain())
    return json_response({"status": "completed"})


@router.get("/aliases")
async def list_aliases(svc: Service) -> Response:
    """Every alias."""
    return json_response({"aliases": svc.backend.aliases.listing()})


@router.get("/collections/{name}/aliases")
async def collection_aliases(name: str, svc: Service) -> Response:
    """The aliases of one collection (404 if there is no such collection)."""
    c = await svc.collection(name)
    return json_response({"aliases": svc.backend.aliases.listing(c.name)})
