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

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator
from starlette.responses import Response

from service.http.deps import WRITES, Service
from service.http.kit import JSONRoute, json_response

router = APIRouter(tags=["collections"], route_class=JSONRoute)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateAlias(_Strict):
    """Qdrant's ``CreateAlias``: ``alias_name`` names ``collection_name`` (an existing alias is moved)."""

    collection_name: StrictStr
    alias_name: StrictStr


class DeleteAlias(_Strict):
    """Qdrant's ``DeleteAlias``."""

    alias_name: StrictStr


class RenameAlias(_Strict):
    """Qdrant's ``RenameAlias``."""

    old_alias_name: StrictStr
    new_alias_name: StrictStr


class AliasAction(_Strict):
    """One of Qdrant's ``AliasOperations``: exactly one of the three keys."""

    create_alias: CreateAlias | None = None
    delete_alias: DeleteAlias | None = None
    rename_alias: RenameAlias | None = None

    @model_validator(mode="after")
    def _one(self) -> AliasAction:
        if len(self.model_dump(exclude_none=True)) != 1:
            raise ValueError("an action is exactly one of create_alias, delete_alias, rename_alias")
        return self


class ChangeAliases(_Strict):
    """Body of ``POST /collections/aliases`` (Qdrant's ``ChangeAliasesOperation``)."""

    actions: list[AliasAction] = Field(min_length=1, max_length=1024)

    def plain(self) -> list[dict[str, Any]]:
        """The actions as dicts ``{kind: {args}}`` (:func:`.aliases.apply_actions`)."""
        return [a.model_dump(exclude_none=True) for a in self.actions]


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
