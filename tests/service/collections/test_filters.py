"""The payload filter grammar on both backends: parsing and limits, and the SQLite and Milvus translations held to
the reference semantics (:func:`service.collections.filter_match.matches`) on random payloads and random filters, at the
size limit included (a real Milvus 2.3.5 server; the embedded store's SQLite file)."""

from __future__ import annotations

import random
import uuid

import numpy as np
import pytest

from harness.milvus import milvus_client
from service.collections.embedded import Collection
from service.collections.filter_match import matches
from service.collections.filters import FilterError, Ids, Match, Not, parse_filter
from service.collections.ids import encode_id
from service.collections.index import IndexSpec
from service.collections.milvus.expr import payload_marks, to_expr
from service.collections.milvus.schema import create_physical
from service.collections.schema import VectorsConfig

D = 8
MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}
I64 = (-(2**63), 2**63 - 1)
SCALARS = ["a", "b", "", "1", 1, 2, 2.0, 2.5, -3, 0, True, False, None, I64[0], I64[1], 10**15 + 1]
KEYS = ["x", "y", "tags", "meta.lang", "meta.n"]


def _payloads(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p: dict = {}
        for k in ("x", "y"):
            if rng.random() < 0.8:
                p[k] = rng.choice(SCALARS)
        r = rng.random()
        if r < 0.5:
            p["tags"] = rng.sample(SCALARS, rng.randint(0, 3))
        elif r < 0.6:
            p["tags"] = rng.choice(SCALARS)
        if rng.random() < 0.4:
            p["meta"] = {"lang": rng.choice(["en", "de", None]), "n": rng.choice([1, 2.5, "x", []])}
        out.append(p)
    return out


def _random_filter(rng: random.Random, depth: int = 0) -> dict:
    if depth < 2 and rng.random() < 0.3:
        op = rng.choice(["$and", "$or", "$not"])
        if op == "$not":
            return {"$not": _random_filter(rng, depth + 1)}
        return {op: [_random_filter(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    key = rng.choice(KEYS)
    kind = rng.choice(["eq", "in", "ne", "nin", "range", "exists", "empty", "plain"])
    if kind == "plain":
        return {key: rng.choice(SCALARS)}
    if kind in ("eq", "ne"):
        return {key: {f"${kind}": rng.choice(SCALARS)}}
    if kind in ("in", "nin"):
        return {key: {f"${kind}": rng.sample(SCALARS, rng.randint(1, 4))}}
    if kind == "range":
        ops = rng.sample(["$gt", "$gte", "$lt", "$lte"], rng.randint(1, 2))
        return {key: {op: rng.choice([0, 1, 2, 2.5, -3.5, I64[0], I64[1]]) for op in ops}}
    return {key: {f"${kind}": rng.random() < 0.7}}


FIXED = [
    {"x": "a"}, {"x": 2}, {"x": True}, {"x": None}, {"x": "1"}, {"x": {"$in": ["a", 1, False, 2.5]}},
    {"tags": "a"}, {"tags": {"$in": [1, True]}}, {"tags": {"$empty": True}}, {"tags": {"$ne": "a"}},
    {"meta.lang": "en"}, {"meta.lang": None}, {"meta.n": {"$gte": 1, "$lt": 3}}, {"meta.n": {"$empty": True}},
    {"x": I64[0]}, {"x": {"$in": [I64[0], I64[1]]}}, {"x": {"$gt": I64[0]}}, {"x": {"$lte": I64[0]}},
    {"x": {"$exists": False}}, {"$or": [{"x": "a"}, {"y": {"$nin": ["b", 2]}}]}, {"$not": {"x": {"$gt": 0}}},
    {"x": {"$in": [1, 1.5]}}, {"y": {"$gte": 2, "$lte": 2}}, {"x": 10**15 + 1},
]  # fmt: skip


def _filters() -> list[dict]:
    rng = random.Random(7)
    return FIXED + [_random_filter(rng) for _ in range(150)]


@pytest.mark.parametrize(
    "bad",
    [
        [], "x", {}, {"a": [1, 2]}, {"a": {"x": 1}}, {"a": {"$in": []}}, {"a": {"$in": 3}}, {"a": {"$gt": "1"}},
        {"a": {"$gt": True}}, {"": 1}, {"$a": 1}, {"a..b": 1}, {"a": {"$in": [[1]]}}, {"a": float("nan")},
        {"a": {}}, {"$and": []}, {"$or": {"a": 1}}, {"$not": 1}, {"$ids": []}, {"$ids": [-1]}, {"$ids": [1.5]},
        {"a": {"$exists": 1}}, {"a": 2**63}, {"a[x]": 1}, {"a": {"$gt": "1", "$lt": 2}},
    ],
)  # fmt: skip
def test_malformed_filters_rejected(bad):
    with pytest.raises(FilterError):
        parse_filter(bad)


def test_size_and_depth_limits():
    parse_filter({"g": {"$in": list(range(1024))}})
    parse_filter({f"k{i}": i for i in range(1024)})
    with pytest.raises(FilterError, match="more than 1024 values"):
        parse_filter({"g": {"$in": list(range(1025))}})
    with pytest.raises(FilterError, match="more than 1024 values"):
        parse_filter({"g": {"$in": list(range(1000))}, "$ids": list(range(25))})
    with pytest.raises(FilterError, match="more than 8 values"):
        parse_filter({f"k{i}": i for i in range(9)}, max_values=8)
    deep: dict = {"a": 1}
    for _ in range(16):
        deep = {"$not": deep}
    parse_filter(deep)
    with pytest.raises(FilterError, match="nested more than 16"):
        parse_filter({"$not": deep})


def test_operators_parse_to_the_tree():
    assert parse_filter({"a": {"$nin": [1, "x"]}}) == Not(Match("a", (1, "x")))
    assert parse_filter({"$ids": [3, "p"]}) == Ids((3, "p"))
    assert matches(parse_filter({"tags": "a"}), {"tags": ["b", "a"]})
    assert not matches(parse_filter({"tags": None}), {"tags": [None]})
    assert matches(parse_filter({"x": {"$ne": 1}}), {})  # a missing key is "not equal"
    assert not matches(parse_filter({"x": {"$gt": 0}}), {"x": [5]})  # ranges compare numbers, not arrays
    assert matches(parse_filter({"x": {"$empty": True}}), {"x": []})
    assert matches(parse_filter({"$ids": [7]}), {}, 7) and not matches(parse_filter({"$ids": [7]}), {}, "7")


@pytest.fixture(scope="module")
def data():
    payloads = _payloads(400)
    ids = [i if i % 3 else f"p{i}" for i in range(len(payloads))]
    return ids, payloads


def _expected(f, ids, payloads) -> set:
    tree = parse_filter(f)
    return {pid for pid, p in zip(ids, payloads) if matches(tree, p, pid)}


def test_sqlite_translation_agrees_with_the_reference(tmp_path, data):
    ids, payloads = data
    c = Collection.create(tmp_path / "c", VectorsConfig.single(IndexSpec("flat", "cosine", {}, D), MODEL))
    c.upsert(ids, ["t"] * len(ids), payloads, np.random.default_rng(0).standard_normal((len(ids), D)))
    key_of = {i + 1: pid for i, pid in enumerate(ids)}  # iids are 1.. in insertion order
    seen_nonempty = 0
    for f in _filters() + [{"$ids": [1, "p3", "p4", 999]}, {"$not": {"$ids": [1, 2]}, "x": {"$exists": True}}]:
        want = _expected(f, ids, payloads)
        got = {key_of[int(i)] for i in c.store.matching_iids(parse_filter(f))}
        assert got == want, f
        seen_nonempty += bool(want) and len(want) < len(ids)
    assert seen_nonempty > 100  # the filters discriminate
    # at the size limit: 1,024 ANDed keys, a 1,024-value $in and 1,024 ORed conditions all run
    big_and = {f"k{i}": i for i in range(1023)} | {"x": "a"}
    assert len(c.store.matching_iids(parse_filter(big_and))) == 0
    big_in = {"x": {"$in": [*range(1000, 2023), "a"]}}
    assert {key_of[int(i)] for i in c.store.matching_iids(parse_filter(big_in))} == _expected(big_in, ids, payloads)
    big_or = {"$or": [{f"k{i}": i} for i in range(1023)] + [{"x": "a"}]}
    assert {key_of[int(i)] for i in c.store.matching_iids(parse_filter(big_or))} == _expected(big_or, ids, payloads)
    n, _ = c.delete(where=parse_filter({f"k{i}": i for i in range(1024)}))
    assert n == 0
    c.close()


def test_milvus_translation_agrees_with_the_reference(milvus_uri, data):
    ids, payloads = data
    client = milvus_client(milvus_uri)
    name = f"f{uuid.uuid4().hex[:12]}"
    create_physical(client, name, IndexSpec("flat", "cosine", {}, D), "Strong")
    try:
        vecs = np.random.default_rng(0).standard_normal((len(ids), D)).astype(np.float32)
        rows = [
            {"key": encode_id(pid), "text": "t", "payload": p, "nulls": payload_marks(p), "updated": 0, "vector": v}
            for pid, p, v in zip(ids, payloads, vecs)
        ]
        client.upsert(name, rows)

        def got(f) -> set:
            res = client.query(name, filter=to_expr(parse_filter(f)), output_fields=["key"], limit=16384)
            return {json_id(r["key"]) for r in res}

        for f in _filters() + [{"$ids": [1, "p3", "p4", 999]}, {"$not": {"$ids": [1, 2]}, "x": {"$exists": True}}]:
            assert got(f) == _expected(f, ids, payloads), (f, to_expr(parse_filter(f)))
        big_and = {f"k{i}": i for i in range(1023)} | {"x": "a"}
        assert got(big_and) == set()
        big_in = {"x": {"$in": [*range(1000, 2023), "a"]}}
        assert got(big_in) == _expected(big_in, ids, payloads)
        big_or = {"$or": [{f"k{i}": i} for i in range(1023)] + [{"x": "a"}]}
        assert got(big_or) == _expected(big_or, ids, payloads)
        # the same filter through a vector search (a different plan path in Milvus than query)
        res = client.search(name, data=[vecs[0].tolist()], limit=5, filter=to_expr(parse_filter(big_and)))
        assert list(res[0]) == []
    finally:
        client.drop_collection(name)
        client.close()


def json_id(key: str):
    import json

    return json.loads(key)
