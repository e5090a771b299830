"""Limits and hostile input on the collections routes, the same answer on both backends (a real Milvus server for
``milvus``): filters up to their size limit work and one value more is 422; payloads up to their byte limit are
stored and one byte more is 422; mixed int/float ``$in`` lists and the int64 minimum filter as on the embedded
backend; every string id is addressable; malformed bodies are 422 ``invalid_value``; booleans are not numbers."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.server_utils import collections_server

I64_MIN = -(2**63)


@pytest.fixture(scope="module", params=["embedded", "milvus"])
def env(request, default_artifact: Path, tmp_path_factory):
    yield from collections_server(request, default_artifact, tmp_path_factory)


@pytest.fixture(scope="module")
def col(env) -> str:
    """Collection ``lim``: 40 points, ids 0..39, payload {g: i % 4 (an int, or 1.5 for i = 39), k: i64 min for i = 7}."""
    c = env["client"]
    assert c.put("/collections/lim", json={}).status_code == 200
    pts = [{"id": i, "text": f"sentence number {i}", "payload": {"g": 1.5 if i == 39 else i % 4}} for i in range(40)]
    pts[7]["payload"]["k"] = I64_MIN
    assert c.put("/collections/lim/points", json={"points": pts}).status_code == 200
    return "lim"


def err(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    if code:
        assert e["code"] == code, e
    return e


def _search(c: httpx.Client, flt, top_k: int = 100) -> list:
    r = c.post("/collections/lim/search", json={"query": "sentence", "top_k": top_k, "filter": flt})
    assert r.status_code == 200, r.text
    return sorted(h["id"] for h in r.json())


def test_filters_up_to_the_size_limit_work_and_one_more_value_is_422(env, col):
    c = env["client"]
    assert _search(c, {"g": {"$in": [*range(1, 1024)]}}) == [i for i in range(39) if i % 4 in (1, 2, 3)]
    assert _search(c, {"g": 0} | {f"k{i}": i for i in range(1023)}) == []
    assert _search(c, {"$or": [{"g": 0}] + [{f"k{i}": i} for i in range(1023)]}) == [i for i in range(40) if i % 4 == 0]
    e = err(c.post("/collections/lim/search", json={"query": "x", "filter": {"g": {"$in": [*range(1025)]}}}), 422)
    assert e["code"] == "invalid_filter" and "1024" in e["message"] and e["param"] == "filter"
    batch = {"searches": [{"query": "x"}, {"query": "x", "filter": {f"k{i}": i for i in range(5000)}}]}
    e = err(c.post("/collections/lim/search/batch", json=batch), 422, "invalid_filter")
    assert e["param"] == "searches[1].filter"
    # delete by filter at the limit and over it
    r = c.post("/collections/lim/points/delete", json={"filter": {f"k{i}": i for i in range(1024)}})
    assert r.status_code == 200 and r.json()["deleted"] == 0
    err(c.post("/collections/lim/points/delete", json={"filter": {f"k{i}": i for i in range(5000)}}), 422)


def test_mixed_numbers_and_the_int64_minimum_filter_as_on_every_backend(env, col):
    c = env["client"]
    assert _search(c, {"g": {"$in": [1, 1.5]}}) == [i for i in range(39) if i % 4 == 1] + [39]
    assert _search(c, {"k": I64_MIN}) == [7]
    assert _search(c, {"k": {"$lte": I64_MIN}}) == [7] and _search(c, {"k": {"$gt": I64_MIN}}) == []
    assert (
        _search(c, {"g": {"$gte": 2, "$lt": 3}, "$not": {"$ids": [2, 6]}}) == [i for i in range(40) if i % 4 == 2][2:]
    )


def test_payloads_up_to_the_byte_limit_are_stored_and_larger_ones_are_422(env, col):
    c = env["client"]
    limit = 32768
    # '/' is what the milvus client's JSON encoder doubles (it escapes it): the stored field is near Milvus's cap
    at_limit = {"s": "/" * (limit - len(json.dumps({"s": ""}, separators=(",", ":"))))}
    r = c.put("/collections/lim/points", json={"points": [{"id": 100, "text": "slashes", "payload": at_limit}]})
    assert r.status_code == 200, r.text
    assert c.get("/collections/lim/points/100").json()["payload"] == at_limit
    over = {"s": at_limit["s"] + "/"}
    e = err(c.put("/collections/lim/points", json={"points": [{"id": 101, "text": "x", "payload": over}]}), 422)
    assert e["param"] == "points[0].payload" and str(limit) in e["message"]
    many_keys = {f"key{i}": i for i in range(20000)}
    ok = {"id": 102, "text": "fine"}
    err(c.put("/collections/lim/points", json={"points": [ok, {"id": 103, "text": "x", "payload": many_keys}]}), 422)
    assert c.get("/collections/lim/points/102").status_code == 404  # nothing of a refused request is written
    deep: dict = {"v": 1}
    for _ in range(32):
        deep = {"d": deep}
    e = err(c.put("/collections/lim/points", json={"points": [{"id": 104, "text": "x", "payload": deep}]}), 422)
    assert "nested more than 32" in e["message"]


def test_a_response_is_bounded_in_bytes(env, col):
    """200 big-payload points: one search of them all is answered; 256 such searches in a batch (~1 GB of hits)
    are 413 response_too_large at once, and answered without payloads and texts."""
    c = env["client"]
    big = {"blob": "x" * 30000}
    for start in range(1000, 1200, 50):
        pts = [{"id": i, "text": f"large point {i}", "payload": big} for i in range(start, start + 50)]
        assert c.put("/collections/lim/points", json={"points": pts}).status_code == 200
    one = c.post("/collections/lim/search", json={"query": "large point", "top_k": 300})
    assert one.status_code == 200 and sum(h["payload"] == big for h in one.json()) == 200
    batch = {"searches": [{"query": "large point", "top_k": 1000}] * 256}
    e = err(c.post("/collections/lim/search/batch", json=batch), 413, "response_too_large")
    assert "collections_max_response_bytes" in e["message"]
    bare = {"searches": [{"query": "large point", "top_k": 1000, "with_payload": False, "with_text": False}] * 256}
    r = c.post("/collections/lim/search/batch", json=bare)
    assert r.status_code == 200 and all(len(hits) >= 200 for hits in r.json())
    assert c.post("/collections/lim/points/delete", json={"ids": list(range(1000, 1200))}).json()["deleted"] == 200


def test_every_string_id_is_addressable(env, col):
    c = env["client"]
    ids = ["a\nb", "tab\there", "with/slash", "sp ace", "ünï", "%41"]
    pts = [{"id": i, "text": f"odd id {n}"} for n, i in enumerate(ids)]
    assert c.put("/collections/lim/points", json={"points": pts}).status_code == 200
    for n, i in enumerate(ids):
        r = c.get(f"/collections/lim/points/{quote(i)}", params={"id_type": "string"})
        assert r.status_code == 200 and r.json()["id"] == i and r.json()["text"] == f"odd id {n}", (i, r.text)


def test_malformed_bodies_and_booleans_as_numbers_are_422(env, col):
    c = env["client"]
    deep = "[" * 5000 + "]" * 5000
    for body in (deep.encode(), b'{"query": "\xff\xfe"}', ('{"query": ' + "[" * 1200 + "]" * 1200 + "}").encode()):
        r = c.post("/collections/lim/search", content=body, headers={"content-type": "application/json"})
        err(r, 422, "invalid_value")
    err(c.post("/collections/lim/search", json={"query": [0.1] * 383 + [True]}), 422, "invalid_value")
    err(c.post("/collections/lim/search", json={"query": "x", "score_threshold": True}), 422, "invalid_value")
    err(c.get("/no/such/route"), 404, "not_found")
    assert c.get("/health").status_code == 200
