"""Collection aliases through Qdrant's API, translated onto ``service.collections.aliases``.

Qdrant API reference (https://api.qdrant.tech/api-reference), section "Aliases": ``POST /collections/aliases``
(``update_collection_aliases``: create, delete and rename actions in order, all or none), ``GET /aliases``
(``get_aliases``), ``GET /collections/{collection_name}/aliases`` (``get_collection_aliases``). Every collection
route accepts an alias for ``collection_name``; deleting a collection by an alias is refused (404), as creating a
collection or an alias with a name the other already has (409).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from service.http.kit import JSONRoute
from service.http.qdrant.envelope import PREFIX, WRITES, Service, ok

router = APIRouter(prefix=PREFIX, tags=["qdrant"], route_class=JSONRoute)


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
