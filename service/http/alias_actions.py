"""The body of alias changes, shared by the native and the Qdrant dialects: Qdrant's ``ChangeAliasesOperation``
(Qdrant API reference, https://api.qdrant.tech/api-reference, "Update aliases of the collections"): create, delete
and rename actions, applied in order by :class:`service.collections.aliases.Aliases`, all or none."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator


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
