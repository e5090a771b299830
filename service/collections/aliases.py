"""Collection aliases: other names of a collection, switched atomically (Qdrant's collection aliases,
https://qdrant.tech/documentation/concepts/collections/#collection-aliases; API reference "Update aliases of the
collections"): the blue/green recipe is to build a new collection beside the live one, then move the alias that
clients use onto it in one request.

Every collection operation accepts an alias where it takes a collection name (the backends' ``get`` resolves it);
a collection's info still names the collection. Alias and collection names share one namespace: an alias cannot
take a collection's name nor a collection an alias's. Deleting a collection deletes its aliases.

:class:`Aliases` holds the map and applies a request's actions in order, all or none, persisting the new map in one
write (``save``): the embedded backend writes a JSON file atomically; the milvus backend one registry row, read by
every replica at its refresh (an alias switched by one replica is seen by the others within
``collections_milvus_refresh_s``; two replicas changing aliases at once: the last write wins, as Milvus has no
compare-and-set).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from service.collections.errors import AliasNotFound, CollectionExists, CollectionNotFound, InvalidCollectionRequest
from service.collections.vector_backend import NAME_RE


def _check(alias: str, param: str) -> None:
    if not NAME_RE.match(alias):
        raise InvalidCollectionRequest(f"alias name {alias!r} must match {NAME_RE.pattern}", param=param)


def apply_actions(
    current: dict[str, str], actions: list[dict[str, Any]], exists: Callable[[str], bool]
) -> dict[str, str]:
    """The alias map after Qdrant's ``actions`` (in order), without changing ``current``.

    Args:
        current: ``{alias: collection}``.
        actions: each one of ``{"create_alias": {collection_name, alias_name}}`` (an existing alias is moved),
            ``{"delete_alias": {alias_name}}``, ``{"rename_alias": {old_alias_name, new_alias_name}}``.
        exists: whether a collection of that name exists.

    Raises:
        CollectionNotFound: ``create_alias`` for a missing collection (an alias names a collection, not an alias).
        CollectionExists: an alias named like a collection.
        AliasNotFound: ``delete_alias`` or ``rename_alias`` of a missing alias.
        InvalidCollectionRequest: an alias name that is not a valid collection name.
    """
    new = dict(current)
    for i, action in enumerate(actions):
        (kind, args), where = next(iter(action.items())), f"actions[{i}]"
        if kind == "create_alias":
            alias, target = args["alias_name"], args["collection_name"]
            _check(alias, f"{where}.create_alias.alias_name")
            if not exists(target):
                raise CollectionNotFound(f"{where}: collection {target!r} not found", param=f"{where}.create_alias")
            if exists(alias):
                raise CollectionExists(f"{where}: a collection is named {alias!r}", param=f"{where}.create_alias")
            new[alias] = target
        elif kind == "delete_alias":
            if new.pop(args["alias_name"], None) is None:
                raise AliasNotFound(f"{where}: alias {args['alias_name']!r} not found", param=f"{where}.delete_alias")
        elif kind == "rename_alias":
            old, alias = args["old_alias_name"], args["new_alias_name"]
            _check(alias, f"{where}.rename_alias.new_alias_name")
            if old not in new:
                raise AliasNotFound(f"{where}: alias {old!r} not found", param=f"{where}.rename_alias")
            if exists(alias):
                raise CollectionExists(f"{where}: a collection is named {alias!r}", param=f"{where}.rename_alias")
            new[alias] = new.pop(old)
        else:
            raise InvalidCollectionRequest(f"{where}: unknown alias action {kind!r}", param=where)
    return new


class Aliases:
    """The alias map of a backend.

    Args:
        load: returns the persisted ``{alias: collection}`` (blocking).
        save: persists a whole new map in one write (blocking).
    """

    def __init__(self, load: Callable[[], dict[str, str]], save: Callable[[dict[str, str]], None]) -> None:
        self._load, self._save = load, save
        self.map: dict[str, str] = {}
        self._lock = threading.Lock()

    def reload(self) -> None:
        """Read the persisted map (at start; the milvus backend at each refresh). Under the lock of :meth:`update`:
        a read from before an update's write must not replace the map that update set. Blocking."""
        with self._lock:
            self.map = dict(self._load())

    def resolve(self, name: str) -> str | None:
        """The collection an alias names, or None."""
        return self.map.get(name)

    def listing(self, collection: str | None = None) -> list[dict[str, str]]:
        """``[{alias_name, collection_name}]`` sorted by alias, of ``collection`` only when given (Qdrant API
        reference: the answers of "List collections aliases" and "List aliases for collection")."""
        return [{"alias_name": a, "collection_name": c} for a, c in sorted(self.map.items()) if collection in (None, c)]

    def of(self, collection: str) -> list[str]:
        """The aliases of ``collection``, sorted."""
        return sorted(a for a, c in self.map.items() if c == collection)

    def update(self, actions: list[dict[str, Any]], exists: Callable[[str], bool]) -> None:
        """Apply ``actions`` (:func:`apply_actions`) to the persisted map read now and persist the result, all or
        none. Blocking."""
        with self._lock:
            self.map = dict(self._load())
            new = apply_actions(self.map, actions, exists)
            if new != self.map:
                self._save(new)
                self.map = new

    def drop_collection(self, collection: str) -> None:
        """Delete the aliases of a deleted collection from the persisted map read now. Blocking."""
        with self._lock:
            self.map = dict(self._load())
            if collection in self.map.values():
                new = {a: c for a, c in self.map.items() if c != collection}
                self._save(new)
                self.map = new
