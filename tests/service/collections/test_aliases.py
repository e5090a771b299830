"""Collection aliases without the service: Qdrant's actions applied in order, all or none, and the embedded backend
keeping them across a restart (the routes, both backends and qdrant-client: tests/service/http/qdrant/test_qdrant_clients.py)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from service.collections.aliases import Aliases, apply_actions
from service.collections.embedded.backend import EmbeddedBackend
from service.collections.errors import AliasNotFound, CollectionExists, CollectionNotFound, InvalidCollectionRequest
from service.collections.vector_backend import single_config

MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}


def create(c: str, a: str) -> dict:
    return {"create_alias": {"collection_name": c, "alias_name": a}}


def test_actions_apply_in_order_all_or_none():
    exists = {"a", "b"}.__contains__
    cur = {"prod": "a"}
    # the switch, then a rename: in order
    new = apply_actions(cur, [{"delete_alias": {"alias_name": "prod"}}, create("b", "prod"),
                              {"rename_alias": {"old_alias_name": "prod", "new_alias_name": "live"}}], exists)  # fmt: skip
    assert new == {"live": "b"} and cur == {"prod": "a"}
    assert apply_actions(cur, [create("b", "prod")], exists) == {"prod": "b"}  # create moves an existing alias
    for actions, err in (
        ([create("b", "x"), {"delete_alias": {"alias_name": "nope"}}], AliasNotFound),
        ([create("missing", "x")], CollectionNotFound),
        ([create("a", "b")], CollectionExists),  # "b" is a collection
        ([{"rename_alias": {"old_alias_name": "prod", "new_alias_name": "a"}}], CollectionExists),
        ([{"rename_alias": {"old_alias_name": "nope", "new_alias_name": "x"}}], AliasNotFound),
        ([create("a", "bad name")], InvalidCollectionRequest),
    ):
        with pytest.raises(err):
            apply_actions(cur, actions, exists)


def test_embedded_aliases_persist_resolve_and_go_with_their_collection(tmp_path):
    x = np.eye(4, dtype=np.float32)

    async def main() -> None:
        b = EmbeddedBackend(tmp_path / "data" / "collections")
        await b.start()
        c = await b.create("docs", single_config("docs", "flat", None, "cosine", MODEL, 4))
        await b.run(c.upsert, [1, 2], ["a", "b"], [{}, {}], x[:2])
        await b.update_aliases([create("docs", "prod")])
        assert b.get("prod") is c
        with pytest.raises(CollectionExists):
            await b.create("prod", single_config("prod", "flat", None, "cosine", MODEL, 4))
        with pytest.raises(CollectionExists):  # a snapshot is recovered into a collection's own name only
            await b.snapshots.recover("prod", tmp_path / "none.snapshot", None)
        await b.close()
        b2 = EmbeddedBackend(tmp_path / "data" / "collections")
        await b2.start()
        assert b2.get("prod").name == "docs" and b2.get("prod").count == 2
        with pytest.raises(CollectionNotFound):
            await b2.delete("prod")  # not by an alias
        await b2.delete("docs")
        assert b2.aliases.map == {} and (tmp_path / "data" / "aliases.json").read_text().strip() == "{}"
        with pytest.raises(CollectionNotFound):
            b2.get("prod")
        await b2.close()

    asyncio.run(main())


def test_a_reload_that_read_before_an_update_does_not_undo_it():
    """The milvus backend reloads the map at every refresh, on another thread than an update: a reload that read the
    stored map before an update was saved must not put that old map back after it (the update would be lost from
    this view until the next refresh, and the alias a 404)."""
    stored: dict[str, str] = {}
    in_load, release = threading.Event(), threading.Event()

    def load() -> dict[str, str]:
        snapshot = dict(stored)
        if threading.current_thread().name == "refresh":  # the refresh reads the old map, then stalls
            in_load.set()
            release.wait(5)
        return snapshot

    def save(new: dict[str, str]) -> None:  # a whole map in one write, as both backends' saves
        stored.clear()
        stored.update(new)

    aliases = Aliases(load, save)
    refresh = threading.Thread(target=aliases.reload, name="refresh")
    refresh.start()
    assert in_load.wait(5)
    update = threading.Thread(target=aliases.update, args=([create("blue", "prod")], {"blue"}.__contains__))
    update.start()
    update.join(0.5)  # without the lock it finishes here, before the stale reload lands
    release.set()
    refresh.join(5)
    update.join(5)
    assert stored == {"prod": "blue"} and aliases.resolve("prod") == "blue"
