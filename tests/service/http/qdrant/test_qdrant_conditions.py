"""Qdrant's richer filter conditions (full text, datetime ranges, values_count, geo areas, nested, min_should, keys into
arrays) through the Qdrant translation and the embedded store's SQL, held to qdrant-client's local mode (the
oracle: its in-memory implementation of Qdrant's filtering) on the same points, one random filter at a time."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from qdrant_client import QdrantClient, models

from service.collections.embedded import Collection
from service.collections.filters import FilterError, parse_filter
from service.collections.index import IndexSpec
from service.collections.schema import VectorsConfig
from service.http.qdrant.filters import translate

WORDS = ["ape", "wolf", "cat", "dog", "bee", "fox", "owl", "yak"]
CITIES = [(55.75, 37.61), (51.5, -0.12), (48.85, 2.35), (40.71, -74.0), (-33.86, 151.2), (35.68, 139.69), (1.35, 103.8)]
N = 200


def payload(rng: random.Random, i: int) -> dict:
    p: dict = {"words": " ".join(rng.sample(WORDS, rng.randint(1, 3))), "id_str": [str(rng.randint(1, 30)).zfill(2)
               for _ in range(rng.randint(0, 4))], "two_words": rng.sample(WORDS, 2)}  # fmt: skip
    lat, lon = rng.choice(CITIES)
    p["city"] = {"geo": {"lat": lat + rng.uniform(-2, 2), "lon": lon + rng.uniform(-2, 2)}}
    dt = datetime(2000, 1, 1) + timedelta(seconds=rng.randint(0, 400 * 86400), microseconds=rng.randint(0, 999999))
    tz = timezone(timedelta(hours=rng.randint(-12, 12)))
    p["rand_datetime"] = rng.choice([dt.isoformat(), dt.replace(tzinfo=tz).isoformat(), dt.strftime("%Y-%m-%d"),
                                     dt.strftime("%Y-%m-%d %H:%M:%S"), "not a date"])  # fmt: skip
    p["nested"] = {
        "array": [{"word": rng.choice(WORDS), "number": rng.randint(0, 10)} for _ in range(rng.randint(0, 3))]
    }
    p["nested_array"] = [[rng.randint(-10, 10) for _ in range(rng.randint(0, 3))] for _ in range(rng.randint(0, 3))]
    if i % 7 == 0:
        del p["words"]
    if i % 5 == 0:
        p["id_str"] = None
    if i % 11 == 0:
        del p["id_str"]
    return p


def condition(rng: random.Random, depth: int = 0) -> models.Condition:
    kinds = ["text", "text_any", "phrase", "dt", "count", "radius", "box", "polygon", "nested", "projection", "value"]
    kind = rng.choice(kinds + (["filter"] if depth < 2 else []))
    if kind in ("text", "text_any", "phrase"):
        arg = " ".join(rng.sample(WORDS, rng.randint(1, 2)))
        match = {"text": models.MatchText(text=arg), "text_any": models.MatchTextAny(text_any=arg),
                 "phrase": models.MatchPhrase(phrase=arg)}[kind]  # fmt: skip
        return models.FieldCondition(key="words", match=match)
    if kind == "dt":

        def bound():
            d = datetime(2000, 1, 1) + timedelta(
                seconds=rng.randint(0, 400 * 86400), microseconds=rng.randint(0, 10**6 - 1)
            )
            return d.date() if rng.random() < 0.2 else d.replace(tzinfo=timezone(timedelta(hours=rng.randint(-12, 12))))

        lo, hi = sorted([bound(), bound()], key=lambda d: d.isoformat())
        return models.FieldCondition(
            key="rand_datetime", range=models.DatetimeRange(gt=lo, lte=hi if rng.random() < 0.7 else None)
        )
    if kind == "count":
        return models.FieldCondition(
            key="id_str", values_count=models.ValuesCount(gte=rng.randint(0, 3), lt=rng.choice([None, 3, 5]))
        )
    if kind == "radius":
        lat, lon = rng.choice(CITIES)
        return models.FieldCondition(key="city.geo", geo_radius=models.GeoRadius(
            center=models.GeoPoint(lat=lat, lon=lon), radius=rng.uniform(1e4, 4e5)))  # fmt: skip
    if kind == "box":
        lat, lon = rng.choice(CITIES)
        w = rng.uniform(0.5, 3)
        return models.FieldCondition(key="city.geo", geo_bounding_box=models.GeoBoundingBox(
            top_left=models.GeoPoint(lat=lat + w, lon=lon - w), bottom_right=models.GeoPoint(lat=lat - w, lon=lon + w)))  # fmt: skip
    if kind == "polygon":
        lat, lon = rng.choice(CITIES)
        ring = [(lat - 2, lon - 2), (lat - 2, lon + 2), (lat + 2, lon + 2), (lat + 2, lon - 2), (lat - 2, lon - 2)]
        hole = [(lat - 0.5, lon - 0.5), (lat - 0.5, lon + 0.5), (lat + 0.5, lon + 0.5), (lat - 0.5, lon - 0.5)]
        pts = lambda r: models.GeoLineString(points=[models.GeoPoint(lat=a, lon=b) for a, b in r])  # noqa: E731
        return models.FieldCondition(
            key="city.geo", geo_polygon=models.GeoPolygon(exterior=pts(ring), interiors=[pts(hole)])
        )
    if kind == "nested":
        inner = models.Filter(must=[models.FieldCondition(key="word", match=models.MatchValue(value=rng.choice(WORDS)))],
                              must_not=[models.FieldCondition(key="number", range=models.Range(lt=rng.randint(0, 10)))])  # fmt: skip
        return models.NestedCondition(
            nested=models.Nested(key=rng.choice(["nested.array", "nested.array[]"]), filter=inner)
        )
    if kind == "projection":
        key = rng.choice(["nested_array[][]", "nested_array[0][]", "nested_array[1][0]", "nested.array[].number"])
        return models.FieldCondition(key=key, range=models.Range(lt=rng.randint(-10, 10)))
    if kind == "value":
        return models.FieldCondition(key="nested.array[].word", match=models.MatchValue(value=rng.choice(WORDS)))
    return a_filter(rng, depth + 1)


def a_filter(rng: random.Random, depth: int = 0) -> models.Filter:
    conds = [condition(rng, depth) for _ in range(rng.randint(1, 3))]
    shape = rng.choice(["must", "should", "must_not", "min_should"])
    if shape == "min_should":
        return models.Filter(min_should=models.MinShould(conditions=conds, min_count=rng.randint(1, len(conds))))
    return models.Filter(**{shape: conds})


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    rng = random.Random(5)
    payloads = [payload(rng, i) for i in range(N)]
    local = QdrantClient(":memory:")
    local.create_collection("c", vectors_config=models.VectorParams(size=2, distance=models.Distance.DOT))
    local.upsert("c", [models.PointStruct(id=i, vector=[1.0, 0.0], payload=p) for i, p in enumerate(payloads)])
    spec = IndexSpec("flat", "dot", {}, 2)
    coll = Collection.create(
        tmp_path_factory.mktemp("qc") / "c",
        VectorsConfig.single(spec, {"name": "m", "version": "1", "sha256": "0" * 64}),
    )
    coll.upsert(list(range(N)), [""] * N, payloads, np.tile(np.array([[1.0, 0.0]], np.float32), (N, 1)))
    yield local, coll
    coll.close()


def test_conditions_agree_with_qdrant_client_local_mode(both):
    local, coll = both
    rng = random.Random(11)
    seen = {"non-trivial": 0}
    for _ in range(250):
        f = a_filter(rng)
        raw = json.loads(f.model_dump_json(exclude_none=True, by_alias=True))  # what qdrant-client sends over REST
        expected = sorted(p.id for p in local.scroll("c", scroll_filter=f, limit=N)[0])
        tree = translate(raw)
        got = sorted(p["id"] for p in coll.scroll(None, N, parse_filter(tree) if tree is not None else None))
        assert got == expected, json.dumps(raw)
        seen["non-trivial"] += 0 < len(expected) < N
    assert seen["non-trivial"] > 90  # the filters discriminate, not all or nothing


def test_malformed_conditions_are_filter_errors():
    for bad in ({"g": {"$count": {"$gt": -1}}}, {"g": {"$geo_radius": {"center": {"lat": 1}, "radius": 5}}},
                {"g": {"$gt": "2021-01-01", "$lt": 5}}, {"g": {"$gte": "yesterday"}}, {"a[x]": 1}, {"a]": 1},
                {"$min_should": {"filters": [{"a": 1}], "count": 0}}, {"$nested": {"key": "a"}},
                {"g": {"$geo_polygon": {"exterior": {"points": [{"lat": 0, "lon": 0}] * 3}}}}):  # fmt: skip
        with pytest.raises(FilterError):
            parse_filter(bad)


def test_milvus_refuses_what_its_expressions_cannot_state():
    from service.collections.errors import InvalidCollectionRequest
    from service.collections.milvus.expr import to_expr

    for raw in ({"w": {"$text": "a b"}}, {"t": {"$gte": "2021-01-01"}}, {"t": {"$count": {"$gt": 1}}}, {"a[].b": 1},
                {"g": {"$geo_radius": {"center": {"lat": 1, "lon": 2}, "radius": 5}}},
                {"$nested": {"key": "a", "filter": {"b": 1}}}, {"$min_should": {"filters": [{"a": 1}], "count": 1}},
                {"$or": [{"x": 1}, {"y": {"$text": "z"}}]}):  # fmt: skip
        with pytest.raises(InvalidCollectionRequest) as e:
            to_expr(parse_filter(raw))
        assert e.value.code == "unsupported", raw
    assert to_expr(parse_filter({"a.b": {"$gte": 1}})) == '(payload["a"]["b"] >= 1)'


def test_set_payload_at_a_key_path_as_local_mode():
    """``set_at`` (set_payload with ``key``) writes where qdrant-client's local mode writes, on paths through objects,
    arrays, indexes, scalars in the way and nulls that remove keys."""
    from copy import deepcopy

    from qdrant_client.local.json_path_parser import parse_json_path
    from qdrant_client.local.payload_value_setter import set_value_by_key

    from service.collections.payload_update import set_at

    payloads = [{}, {"a": 5}, {"a": {"b": 1, "c": [1, {"d": 2}]}}, {"a": [{"x": 1}, 7, {"y": None}]},
                {"a": {"b": [[1], {"z": 3}]}}, {"b": "s"}]  # fmt: skip
    keys = ["a", "a.b", "a[]", "a[0]", "a[1].q", "a.c[1]", "a.c[]", "a.b[1].z", "a.b[0][]", "b.c", "a[5]"]
    values = [{"n": 1}, {"c": None, "k": [1]}, {"y": None}]
    for p in payloads:
        for key in keys:
            for v in values:
                want = deepcopy(p)
                set_value_by_key(want, parse_json_path(key), deepcopy(v))
                assert set_at(p, key, v) == want, (p, key, v)
