"""Payload indexes of the embedded backend (the core, without HTTP): a filter answers the same with an index as
without one, for every condition an index covers and those it does not, through writes, payload changes and a
restart; a covered filter is answered from the index (not from the payloads); bad schemas are refused."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.embedded.store import DB_FILE
from service.collections.embedded.store.payload_index import entries, exact_set
from service.collections.errors import InvalidCollectionRequest
from service.collections.filters import parse_filter
from service.collections.index import IndexSpec, normalize_params
from service.collections.payload_indexes import payload_index
from service.collections.schema import VectorsConfig

D = 16
MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}
WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "Eta", "theta"]
INDEXES = {
    "kw": "keyword",
    "num": "integer",
    "price": {"type": "float", "is_principal": True},
    "flag": "bool",
    "ts": "datetime",
    "uid": "uuid",
    "body": {"type": "text", "tokenizer": "word", "lowercase": True},
    "meta.lang": "keyword",
    "tags": "keyword",
    "items[].n": "integer",
}
UUIDS = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(6)]


def payload(r: random.Random) -> dict:
    """A random payload: every key may be missing, of its usual type, of another type, an array or null."""
    p: dict = {}
    pick = r.random
    if pick() < 0.9:
        p["kw"] = r.choice([r.choice(WORDS), r.choice(WORDS), [r.choice(WORDS), r.choice(WORDS)], 3, None, True])
    if pick() < 0.9:
        p["num"] = r.choice([r.randint(-5, 20), r.randint(0, 9), float(r.randint(0, 9)), [r.randint(0, 9), 3], "7"])
    if pick() < 0.8:
        p["price"] = r.choice([round(r.uniform(0, 100), 2), r.randint(0, 100), [1.5, 99.0], False])
    if pick() < 0.8:
        p["flag"] = r.choice([True, False, [True, False], 1, 0, "true"])
    if pick() < 0.8:
        day = r.randint(1, 28)
        p["ts"] = r.choice(
            [f"2024-03-{day:02d}T10:00:00Z", f"2024-03-{day:02d}", f"2024-03-{day:02d} 12:30:00+02:00", "soon", 5]
        )
    if pick() < 0.7:
        p["uid"] = r.choice(UUIDS)
    if pick() < 0.8:
        p["body"] = r.choice([" ".join(r.choices(WORDS, k=r.randint(1, 5))), [r.choice(WORDS), "Zeta eta"], 9])
    if pick() < 0.7:
        p["meta"] = r.choice([{"lang": r.choice(["en", "fr", "de"])}, {"lang": ["en", "de"]}, {"other": 1}, "en"])
    if pick() < 0.7:
        p["tags"] = r.sample(WORDS, r.randint(0, 3))
    if pick() < 0.6:
        p["items"] = [{"n": r.randint(0, 6)} for _ in range(r.randint(0, 3))]
    return p


def raw_filter(r: random.Random, depth: int = 0) -> dict:
    """A random filter of the grammar (:mod:`service.collections.filters`) over the keys above."""
    if depth < 2 and r.random() < 0.35:
        op = r.choice(["$and", "$or", "$not"])
        if op == "$not":
            return {"$not": raw_filter(r, depth + 1)}
        return {op: [raw_filter(r, depth + 1) for _ in range(r.randint(2, 3))]}
    day = r.randint(1, 28)
    choices = [
        {"kw": r.choice(WORDS)},
        {"kw": {"$in": r.sample(WORDS, 2)}},
        {"kw": {"$nin": r.sample(WORDS, 3)}},
        {"kw": {"$ne": r.choice(WORDS)}},
        {"kw": 3},
        {"num": r.randint(0, 9)},
        {"num": {"$in": [r.randint(0, 9), 3.0]}},
        {"num": {"$gte": r.randint(-5, 10), "$lt": r.randint(5, 21)}},
        {"num": {"$gt": r.uniform(0, 9)}},
        {"price": {"$lte": r.uniform(0, 100)}},
        {"price": {"$gt": r.uniform(0, 50), "$lte": r.uniform(50, 100)}},
        {"flag": r.choice([True, False])},
        {"flag": {"$ne": True}},
        {"ts": {"$gte": f"2024-03-{day:02d}T00:00:00Z"}},
        {"ts": {"$gt": "2024-03-05", "$lt": f"2024-03-{day:02d}T11:00:00+01:00"}},
        {"uid": r.choice(UUIDS)},
        {"body": {"$text": " ".join(r.sample(WORDS, r.randint(1, 2)))}},
        {"body": {"$text_any": " ".join(r.sample(WORDS, 2))}},
        {"body": {"$phrase": "zeta eta"}},
        {"meta.lang": r.choice(["en", "fr", "de"])},
        {"tags": {"$in": r.sample(WORDS, 2)}},
        {"items[].n": {"$gte": r.randint(0, 6)}},
        {"items[].n": r.randint(0, 6)},
        {"kw": {"$exists": True}},
        {"$ids": [r.randint(0, 300) for _ in range(5)]},
        {"num": None},
    ]
    return r.choice(choices)


def make(path: Path) -> Collection:
    spec = IndexSpec("flat", "cosine", normalize_params("flat", {}, D), D)
    return Collection.create(path, VectorsConfig.single(spec, MODEL))


def answers(c: Collection, flt: dict, q: np.ndarray) -> tuple:
    """What a filter selects: the count, every matching id (a scroll) and the ids of a top-10 search."""
    where = parse_filter(flt)
    ids = [p["id"] for p in c.scroll(None, 10_000, where, with_text=False, with_payload=False)]
    hits = [h.id for h in c.search(q, 10, where, with_text=False, with_payload=False)[0]]
    return c.count_matching(where), ids, hits


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """Two collections holding the same 800 points, one with the indexes of :data:`INDEXES`."""
    root = tmp_path_factory.mktemp("twins")
    plain, indexed = make(root / "plain"), make(root / "indexed")
    r = random.Random(7)
    rng = np.random.default_rng(7)
    n = 800
    ids = list(range(n))
    X = rng.standard_normal((n, D)).astype(np.float32)
    payloads = [payload(r) for _ in range(n)]
    for c in (plain, indexed):
        c.upsert(ids, ["t"] * n, payloads, X)
    for key, schema in INDEXES.items():
        indexed.create_payload_index(payload_index(key, schema))
    yield plain, indexed, r, rng
    plain.close()
    indexed.close()


def same_answers(plain: Collection, indexed: Collection, r: random.Random, rng: np.random.Generator, n: int) -> None:
    q = rng.standard_normal((1, D)).astype(np.float32)
    for _ in range(n):
        flt = raw_filter(r)
        assert answers(indexed, flt, q) == answers(plain, flt, q), flt
        # the admitted ids themselves: each once, sorted, the same from the index as from the payloads (the twins
        # took the same writes in the same order, so the same internal ids)
        got, want = (c.store.matching_iids(parse_filter(flt)) for c in (indexed, plain))
        assert np.array_equal(got, want) and bool(np.all(np.diff(got) > 0)), flt


def test_indexed_filters_answer_as_unindexed(twins):
    plain, indexed, r, rng = twins
    same_answers(plain, indexed, r, rng, 120)
    schema = indexed.info()["payload_indexes"]
    assert set(schema) == set(INDEXES) and schema["price"]["params"] == INDEXES["price"]
    assert schema["kw"] == {"data_type": "keyword", "points": schema["kw"]["points"]} and schema["kw"]["points"] > 300
    assert plain.info()["payload_indexes"] == {}


def test_index_kept_right_by_writes_and_payload_changes(twins):
    plain, indexed, r, rng = twins
    for step in range(4):
        ids = r.sample(range(1000), 100)  # replaces some, adds others
        X = rng.standard_normal((len(ids), D)).astype(np.float32)
        payloads = [payload(r) if step % 3 else {} for _ in ids]  # every third step: payloads cleared
        for c in (plain, indexed):
            c.upsert(ids, ["t"] * len(ids), payloads, X)
        gone = r.sample(range(1000), 30)
        flt = parse_filter({"kw": r.choice(WORDS)})
        for c in (plain, indexed):
            c.delete(gone)
            c.delete(where=flt)
        same_answers(plain, indexed, r, rng, 25)
    stored = [p["payload"] for p in plain.scroll(None, 10_000, with_text=False)]
    schema = indexed.info()["payload_indexes"]
    for key, index in indexed.store.payload_indexes.items():  # the points counts kept by the writes
        assert schema[key]["points"] == sum(bool(entries(index, p)) for p in stored), key


def test_covered_filters_are_read_from_the_index(tmp_path):
    c = make(tmp_path / "c")
    c.upsert(list(range(100)), ["t"] * 100, [{"g": i % 10, "s": f"v{i % 4}"} for i in range(100)], np.eye(100, D))
    c.create_payload_index(payload_index("g", "integer"))
    where = parse_filter({"$or": [{"g": {"$gte": 8}}, {"$not": {"g": {"$ne": 1}}}]})
    assert exact_set(where, c.store.payload_indexes) is not None
    assert exact_set(parse_filter({"s": "v1"}), c.store.payload_indexes) is None  # no index of s
    # make the payloads lie: a filter the index covers still answers from the index
    conn = sqlite3.connect(c.path / DB_FILE)
    conn.execute("UPDATE points SET payload = '{}'")
    conn.commit()
    conn.close()
    assert c.count_matching(where) == 30
    assert c.count_matching(parse_filter({"$and": [{"g": 2}, {"s": "v2"}]})) == 0  # s uncovered: read (now empty)
    c.close()


def test_index_survives_restart_and_is_dropped(tmp_path):
    c = make(tmp_path / "c")
    c.upsert(list(range(50)), ["t"] * 50, [{"g": i % 5} for i in range(50)], np.eye(50, D))
    c.create_payload_index(payload_index("g", "integer"))
    c.create_payload_index(payload_index("g", "integer"))  # the same again: unchanged
    c.close()
    c = Collection.open(tmp_path / "c")
    assert c.info()["payload_indexes"] == {"g": {"data_type": "integer", "points": 50}}
    c.upsert([50], ["t"], [{"g": [1, 2]}], np.eye(1, D))
    assert c.info()["payload_indexes"]["g"]["points"] == 51
    assert c.count_matching(parse_filter({"g": 1})) == 11
    c.create_payload_index(payload_index("g", "keyword"))  # replaced: holds strings only
    assert c.info()["payload_indexes"] == {"g": {"data_type": "keyword", "points": 0}}
    assert c.count_matching(parse_filter({"g": 1})) == 11  # not covered by a keyword index: read from payloads
    assert c.delete_payload_index("g") and not c.delete_payload_index("g")
    assert c.info()["payload_indexes"] == {}
    c.close()
    c = Collection.open(tmp_path / "c")
    assert c.store.payload_indexes == {} and c.count_matching(parse_filter({"g": 1})) == 11
    n = sqlite3.connect(c.path / DB_FILE).execute("SELECT COUNT(*) FROM payload_index").fetchone()[0]
    assert n == 0
    c.close()


@pytest.mark.parametrize(
    "key,schema,param",
    [
        ("g", "geo", "field_schema"),
        ("g", "nope", "field_schema"),
        ("g", None, "field_schema"),
        ("g", {"type": "keyword", "tokenizer": "word"}, "field_schema"),
        ("", "keyword", "field_name"),
        ("a..b", "keyword", "field_name"),
    ],
)
def test_bad_schemas_are_refused(key, schema, param):
    with pytest.raises(InvalidCollectionRequest) as e:
        payload_index(key, schema)
    assert e.value.param == param


def test_selective_filters_search_exactly_from_memory_or_the_store(tmp_path, monkeypatch):
    """A filtered search over at most ``exact_filter_threshold`` points is exact, over the vectors the index holds in
    memory however few the allowed points are (each scored in place: no pass over the index); only an index that
    holds no float vectors reads them from SQLite."""
    c = make(tmp_path / "c")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1000, D)).astype(np.float32)
    c.upsert(list(range(1000)), ["t"] * 1000, [{"g": i % 4, "one": i == 7} for i in range(1000)], X)
    c.create_payload_index(payload_index("g", "integer"))
    q = rng.standard_normal((1, D)).astype(np.float32)
    Xn = X / np.linalg.norm(X, axis=1, keepdims=True)
    best = [int(i) for i in np.argsort(-(Xn @ q[0])) if i % 4 == 1][:5]
    read = []
    monkeypatch.setattr(c.store, "vectors_for", lambda *a: read.append(a) or (_ for _ in ()).throw(AssertionError))
    assert [h.id for h in c.search(q, 5, parse_filter({"g": 1}))[0]] == best and not read  # from memory
    assert [h.id for h in c.search(q, 5, parse_filter({"one": True}))[0]] == [7] and not read  # 1 of 1,000 too
    c.close()


def test_writes_go_on_while_an_index_is_built_and_the_index_ends_exact(tmp_path, monkeypatch):
    """An index is built in parts (20 points a part here), writes taking the mutex between them: upserts (new ids,
    replaced ids, changed payloads) and deletions made during the build leave the index exactly what one built
    after them holds (the same filters, the same admitted internal ids as a twin collection without the index)."""
    import threading

    from service.collections.embedded import payload_indexing

    monkeypatch.setattr(payload_indexing, "BUILD_POINTS", 20)
    plain, indexed = make(tmp_path / "plain"), make(tmp_path / "indexed")
    r, rng = random.Random(3), np.random.default_rng(3)
    n = 1500
    X = rng.standard_normal((n, D)).astype(np.float32)
    payloads = [payload(r) for _ in range(n)]
    for c in (plain, indexed):
        c.upsert(list(range(n)), ["t"] * n, payloads, X)
    parts, during, started = [], [], threading.Event()
    real = indexed.store.add_payload_entries
    monkeypatch.setattr(indexed.store, "add_payload_entries", lambda *a: (parts.append(1), started.set(), real(*a))[2])
    build = threading.Thread(target=indexed.create_payload_index, args=(payload_index("num", "integer"),))
    build.start()
    assert started.wait(30)
    for _ in range(15):  # the same writes, in the same order, to both (so the same internal ids)
        ids = r.sample(range(n + 200), 20)
        batch = [payload(r) for _ in ids]
        gone = r.sample(range(n + 200), 5)
        for c in (plain, indexed):
            c.upsert(ids, ["t"] * len(ids), batch, rng.standard_normal((len(ids), D)).astype(np.float32))
            c.delete(gone)
        during.append(build.is_alive())
    build.join()
    assert any(during) and len(parts) > 10  # writes were made while the build went on, between its parts
    assert "num" in indexed.info()["payload_indexes"]
    for flt in ({"num": 3}, {"num": {"$gte": 2, "$lt": 7}}, {"num": {"$in": [0, 9]}}, {"num": {"$gt": 5.5}}):
        where = parse_filter(flt)
        assert exact_set(where, indexed.store.payload_indexes) is not None
        assert np.array_equal(indexed.store.matching_iids(where), plain.store.matching_iids(where)), flt
        assert indexed.count_matching(where) == plain.count_matching(where), flt
    plain.close()
    indexed.close()
