"""Payload indexes through the real qdrant-client against a real server (REST), held to qdrant-client's local mode
(``QdrantClient(":memory:")``, the oracle): filtered count, scroll and search answer as local mode's with indexes
of every type created; ``payload_schema`` reports them with their point counts and loses one deleted; bad schemas are
refused as Qdrant refuses them; the native routes ``PUT``/``DELETE /collections/{name}/payload-indexes/{key}``."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server_utils import run_server

pytest.importorskip("qdrant_client")
pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
from qdrant_client import QdrantClient, models  # noqa: E402
from qdrant_client.http.exceptions import UnexpectedResponse  # noqa: E402

DIM = 8
WORDS = ["red", "green", "blue", "cyan", "magenta", "yellow"]
N = 600
SCHEMAS = {
    "kw": models.PayloadSchemaType.KEYWORD,
    "num": models.PayloadSchemaType.INTEGER,
    "price": models.PayloadSchemaType.FLOAT,
    "flag": models.PayloadSchemaType.BOOL,
    "ts": models.PayloadSchemaType.DATETIME,
    "uid": models.PayloadSchemaType.UUID,
    "body": models.TextIndexParams(type=models.TextIndexType.TEXT, tokenizer=models.TokenizerType.WORD),
    "tags": models.PayloadSchemaType.KEYWORD,
}
UUIDS = [f"5f1c0e4a-0000-4000-8000-00000000000{i}" for i in range(5)]


@pytest.fixture(scope="module")
def clients(default_artifact: Path, tmp_path_factory):
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("payidx")) as s:
        remote = QdrantClient(url=f"{s.url}/qdrant", https=False, timeout=60, check_compatibility=False)
        local = QdrantClient(":memory:")
        r = random.Random(3)
        rng = np.random.default_rng(3)
        points = [
            models.PointStruct(id=i, vector=rng.standard_normal(DIM).tolist(), payload=_payload(r)) for i in range(N)
        ]
        for c in (remote, local):
            c.create_collection("idx", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.DOT))
            c.upsert("idx", points=points)
            for key, schema in SCHEMAS.items():
                c.create_payload_index("idx", field_name=key, field_schema=schema)
        yield remote, local, s.url, r, rng


def _payload(r: random.Random) -> dict:
    day = r.randint(1, 28)
    return {
        "kw": r.choice(WORDS),
        "num": r.randint(0, 30),
        "price": round(r.uniform(0, 50), 3),
        "flag": r.random() < 0.3,
        "ts": f"2025-01-{day:02d}T{r.randint(0, 23):02d}:00:00Z",
        "uid": r.choice(UUIDS),
        "body": " ".join(r.choices(WORDS, k=r.randint(1, 4))),
        "tags": r.sample(WORDS, r.randint(1, 3)),
    }


def _condition(r: random.Random) -> models.Condition:
    day = r.randint(2, 27)
    return r.choice(
        [
            models.FieldCondition(key="kw", match=models.MatchValue(value=r.choice(WORDS))),
            models.FieldCondition(key="kw", match=models.MatchAny(any=r.sample(WORDS, 2))),
            models.FieldCondition(key="kw", match=models.MatchExcept(**{"except": r.sample(WORDS, 3)})),
            models.FieldCondition(key="num", match=models.MatchValue(value=r.randint(0, 30))),
            models.FieldCondition(key="num", range=models.Range(gte=r.randint(0, 15), lt=r.randint(10, 31))),
            models.FieldCondition(key="price", range=models.Range(gt=r.uniform(0, 25), lte=r.uniform(20, 50))),
            models.FieldCondition(key="flag", match=models.MatchValue(value=r.random() < 0.5)),
            models.FieldCondition(
                key="ts", range=models.DatetimeRange(gte=f"2025-01-{day:02d}T00:00:00Z", lt="2025-01-20T06:00:00Z")
            ),
            models.FieldCondition(key="uid", match=models.MatchValue(value=r.choice(UUIDS))),
            models.FieldCondition(key="body", match=models.MatchText(text=" ".join(r.sample(WORDS, 2)))),
            models.FieldCondition(key="tags", match=models.MatchAny(any=r.sample(WORDS, 2))),
            models.HasIdCondition(has_id=r.sample(range(N), 20)),
        ]
    )


def _filter(r: random.Random) -> models.Filter:
    parts = {k: [_condition(r) for _ in range(r.randint(0, 2))] or None for k in ("must", "should", "must_not")}
    if not any(parts.values()):
        parts["must"] = [_condition(r)]
    return models.Filter(**parts)


def test_filtered_reads_with_indexes_answer_as_local_mode(clients):
    remote, local, _, r, rng = clients
    for _ in range(40):
        flt = _filter(r)
        counts = [c.count("idx", count_filter=flt, exact=True).count for c in (remote, local)]
        assert counts[0] == counts[1], flt
        pages = [{p.id for p in c.scroll("idx", scroll_filter=flt, limit=N)[0]} for c in (remote, local)]
        assert pages[0] == pages[1], flt
        q = rng.standard_normal(DIM).tolist()
        hits = [
            [p.id for p in c.query_points("idx", query=q, query_filter=flt, limit=10).points] for c in (remote, local)
        ]
        assert hits[0] == hits[1], flt


def test_payload_schema_is_reported_and_cleared(clients):
    remote, local, *_ = clients
    schema = remote.get_collection("idx").payload_schema
    assert set(schema) == set(SCHEMAS)
    assert schema["kw"].data_type == models.PayloadSchemaType.KEYWORD and schema["kw"].points == N
    assert schema["body"].data_type == models.PayloadSchemaType.TEXT and schema["body"].params.tokenizer == "word"
    assert schema["ts"].points == N and schema["flag"].points == N
    assert {k: v.data_type for k, v in schema.items()} == {
        k: getattr(v, "type", v) for k, v in SCHEMAS.items()
    }  # local mode reports none: the types given
    remote.create_payload_index("idx", field_name="extra", field_schema="keyword")
    assert remote.get_collection("idx").payload_schema["extra"].points == 0
    remote.delete_payload_index("idx", field_name="extra")
    assert "extra" not in remote.get_collection("idx").payload_schema
    remote.delete_payload_index("idx", field_name="never-indexed")  # nothing to drop: accepted


def test_index_follows_writes(clients):
    remote, local, _, r, rng = clients
    for c in (remote, local):
        c.create_collection("w", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.DOT))
        c.create_payload_index("w", field_name="kw", field_schema="keyword")
        c.upsert("w", points=[models.PointStruct(id=i, vector=[1.0] * DIM, payload={"kw": "a"}) for i in range(10)])
        c.set_payload("w", payload={"kw": "b"}, points=[0, 1])
        c.overwrite_payload("w", payload={"other": 1}, points=[2])
        c.clear_payload("w", points_selector=[3])
        c.delete_payload("w", keys=["kw"], points=[4])
        c.delete("w", points_selector=[5])
        c.upsert("w", points=[models.PointStruct(id=6, vector=[1.0] * DIM, payload={"kw": ["a", "b"]})])
    for value in ("a", "b"):
        flt = models.Filter(must=[models.FieldCondition(key="kw", match=models.MatchValue(value=value))])
        got = [sorted(p.id for p in c.scroll("w", scroll_filter=flt, limit=20)[0]) for c in (remote, local)]
        assert got[0] == got[1]
    assert got[0] == [0, 1, 6]
    assert remote.get_collection("w").payload_schema["kw"].points == 6  # 0, 1, 6, 7, 8, 9


def test_bad_schemas_and_unknown_collections(clients):
    remote, _, url, *_ = clients
    c = httpx.Client(base_url=url, timeout=60)
    for body in ({"field_name": "kw", "field_schema": "nope"}, {"field_name": "kw", "field_schema": "geo"}, {}):
        r = c.put("/qdrant/collections/idx/index", json=body)
        assert r.status_code in (400, 422) and r.json()["status"]["error"], body
    with pytest.raises(UnexpectedResponse) as e:
        remote.create_payload_index("absent", field_name="kw", field_schema="keyword")
    assert e.value.status_code == 404
    assert c.delete("/qdrant/collections/absent/index/kw").status_code == 404


def test_native_payload_index_routes(clients):
    _, _, url, *_ = clients
    c = httpx.Client(base_url=url, timeout=60)
    r = c.put("/collections/idx/payload-indexes/meta.lang", json={"schema": {"type": "keyword", "is_tenant": True}})
    assert r.status_code == 200, r.text
    assert r.json()["payload_indexes"]["meta.lang"] == {
        "data_type": "keyword",
        "params": {"type": "keyword", "is_tenant": True},
        "points": 0,
    }
    r = c.delete("/collections/idx/payload-indexes/meta.lang")
    assert r.status_code == 200 and "meta.lang" not in r.json()["payload_indexes"]
    r = c.put("/collections/idx/payload-indexes/x", json={"schema": "integer128"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "field_schema"
    assert c.put("/collections/absent/payload-indexes/x", json={"schema": "keyword"}).status_code == 404
    assert c.delete("/collections/absent/payload-indexes/x").status_code == 404
