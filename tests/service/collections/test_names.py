"""One name rule for collections and aliases: a name that ends in a newline (``abc\\n``) is refused (422
``invalid_value``) like any other invalid name. Python's ``$`` also matches before a final newline, so with the rule
anchored by ``$`` such a name passed the check: the embedded backend made a second collection (and folder) beside
``abc``, and the milvus backend answered 500. Through the native routes and the Qdrant-compatible ones, on both
backends, plus the rule itself."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from service.collections.aliases import apply_actions
from service.collections.errors import InvalidCollectionRequest
from service.collections.vector_backend import NAME_RE
from tests.server_utils import collections_server

BAD = ["abc\n", "abc\r\n", "abc\n\n", "\nabc", "abc\nd"]


@pytest.fixture(scope="module", params=["embedded", "milvus"])
def env(request, default_artifact: Path, tmp_path_factory):
    yield from collections_server(request, default_artifact, tmp_path_factory)


def _name() -> str:
    return f"n{uuid.uuid4().hex[:10]}"


def test_the_rule_refuses_a_trailing_newline():
    for good in ("abc", "A", "a-b_c", "x" * 64):
        assert NAME_RE.match(good), good
    for bad in [*BAD, "x" * 65, "-abc", ""]:
        assert not NAME_RE.match(bad), repr(bad)
    with pytest.raises(InvalidCollectionRequest):
        apply_actions({}, [{"create_alias": {"collection_name": "abc", "alias_name": "prod\n"}}], {"abc"}.__contains__)
    with pytest.raises(InvalidCollectionRequest):
        apply_actions({"prod": "abc"}, [{"rename_alias": {"old_alias_name": "prod", "new_alias_name": "live\n"}}],
                      {"abc"}.__contains__)  # fmt: skip


def test_create_refuses_a_name_with_a_newline(env):
    c = env["client"]
    name = _name()
    for bad in (f"{name}\n", f"{name}\r\n"):
        quoted = bad.replace("\r", "%0D").replace("\n", "%0A")
        r = c.put(f"/collections/{quoted}", json={"index": "flat"})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_value", (bad, r.status_code, r.text)
        r = c.put(f"/qdrant/collections/{quoted}", json={"vectors": {"size": 384, "distance": "Cosine"}})
        assert r.status_code == 422, (bad, r.status_code, r.text)
    names = [x["name"] for x in c.get("/collections").json()["collections"]]
    assert not any(n.startswith(name) for n in names), names
    if env["backend"] == "embedded":  # no folder beside where `name` would live
        root = env["work"] / "data"
        assert not [p for p in root.rglob("*") if p.name.startswith(name)], "a folder was made for a refused name"
    # the name without the newline is a name like any other
    assert c.put(f"/collections/{name}", json={"index": "flat"}).status_code in (200, 201)
    assert c.put(f"/collections/{name}%0A", json={"index": "flat"}).status_code == 422  # not a second one beside it
    assert c.delete(f"/collections/{name}").status_code == 200


def test_aliases_refuse_a_name_with_a_newline(env):
    c = env["client"]
    name, alias = _name(), _name()
    assert c.put(f"/collections/{name}", json={"index": "flat"}).status_code in (200, 201)
    try:
        for path in ("/collections/aliases", "/qdrant/collections/aliases"):
            for action in (
                {"create_alias": {"collection_name": name, "alias_name": f"{alias}\n"}},
                {"create_alias": {"collection_name": f"{name}\n", "alias_name": alias}},
            ):
                r = c.post(path, json={"actions": [action]})
                assert r.status_code in (404, 422), (path, action, r.status_code, r.text)
                if "alias_name" in action["create_alias"] and action["create_alias"]["alias_name"].endswith("\n"):
                    assert r.status_code == 422, (path, action, r.text)
        assert c.post("/collections/aliases", json={"actions": [
            {"create_alias": {"collection_name": name, "alias_name": alias}}]}).status_code == 200  # fmt: skip
        r = c.post("/collections/aliases", json={"actions": [
            {"rename_alias": {"old_alias_name": alias, "new_alias_name": f"{alias}\n"}}]})  # fmt: skip
        assert r.status_code == 422, r.text
        aliases = {a["alias_name"] for a in c.get("/aliases").json()["aliases"]}
        assert alias in aliases and f"{alias}\n" not in aliases, aliases
        # an alias name with a newline cannot be created as a collection either (one rule for both)
        assert c.put(f"/collections/{alias}%0A", json={"index": "flat"}).status_code == 422
    finally:
        c.post("/collections/aliases", json={"actions": [{"delete_alias": {"alias_name": alias}}]})
        c.delete(f"/collections/{name}")
