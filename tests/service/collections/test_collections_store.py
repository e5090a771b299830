"""The collections storage/index layer without the service: SQLite truth, FAISS derivation, snapshots, filtered search,
locking (the filter grammar itself: test_filters.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.embedded.store import Store
from service.collections.embedded.store.order import ORDER_KEY
from service.collections.filters import parse_filter
from service.collections.index import IndexConfigError, IndexSpec, normalize_params
from service.collections.schema import VectorsConfig
from service.collections.vector_backend import single_config

D = 32
MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, D)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make(tmp_path: Path, kind: str, metric: str = "cosine", **params) -> Collection:
    spec = IndexSpec(kind, metric, normalize_params(kind, params, D), D)
    return Collection.create(tmp_path / f"{kind}-{metric}", VectorsConfig.single(spec, MODEL))


def brute(q: np.ndarray, X: np.ndarray, ids: list, k: int) -> list:
    s = X @ q
    return [ids[i] for i in np.argsort(-s, kind="stable")[:k]]


KINDS = [("flat", {}), ("hnsw", {"M": 16, "ef_search": 128}), ("ivf_pq", {"nlist": 8, "m": 8, "min_train_points": 300})]


@pytest.mark.parametrize("kind,params", KINDS)
def test_upsert_replace_delete_filter(tmp_path, kind, params):
    rng = np.random.default_rng(1)
    c = make(tmp_path, kind, **params)
    n = 600
    X = unit(rng, n)
    ids = [i if i % 2 else f"s{i}" for i in range(n)]
    c.upsert(ids, [f"text {i}" for i in range(n)], [{"g": i % 4, "odd": bool(i % 2)} for i in range(n)], X)
    if kind == "ivf_pq":
        assert c.needs_maintenance() and not c.index.trained
        assert c.maintain() == "rebuilt the unnamed vector as ivf_pq (trained)" and c.index.trained
    assert c.count == n
    # every point finds itself first
    for i in range(0, n, 37):
        h = c.search(X[i : i + 1], 1)[0]
        assert h[0].id == ids[i] and h[0].text == f"text {i}" and h[0].payload == {"g": i % 4, "odd": bool(i % 2)}
    # upsert replaces: same id, new vector/text/payload; the old vector no longer finds it
    new = unit(rng, 1)
    c.upsert([ids[5]], ["replaced"], [{"g": 99}], new)
    assert c.count == n
    h = c.search(new, 1)[0][0]
    assert h.id == ids[5] and h.text == "replaced" and h.payload == {"g": 99}
    assert all(x.id != ids[5] for x in c.search(X[5:6], 5)[0])
    assert c.get(ids[5])["text"] == "replaced"
    # delete by ids and by filter
    n_del, _ = c.delete(ids=[ids[7], ids[8], "no-such-id"])
    assert n_del == 2 and c.count == n - 2
    for i in (7, 8):
        assert all(x.id != ids[i] for x in c.search(X[i : i + 1], 10)[0])
        assert c.get(ids[i]) is None
    n_del, _ = c.delete(where=parse_filter({"g": 3}))
    assert n_del == len([i for i in range(n) if i % 4 == 3 and i not in (7,)])
    assert all(x.payload["g"] != 3 for q in c.search(X[:20], 20) for x in q)
    # filtered search: exact top_k among matching points (small filter -> brute force over stored vectors)
    live = {ids[i]: X[i] for i in range(n) if i % 4 != 3 and i not in (5, 7, 8)}
    live[ids[5]] = new[0]
    match = [i for i in range(n) if ids[i] in live and i % 4 == 1]
    for qi in range(5):
        want = brute(X[qi], np.stack([live[ids[i]] for i in match]), [ids[i] for i in match], 10)
        got = [h.id for h in c.search(X[qi : qi + 1], 10, parse_filter({"g": {"$in": [1]}, "odd": True}))[0]]
        assert got == want
    # score_threshold drops weaker hits
    hits = c.search(X[:1], 50, score_threshold=0.3)[0]
    assert hits and all(h.score >= 0.3 for h in hits)
    c.close()


def test_broad_filter_uses_index_selector(tmp_path):
    rng = np.random.default_rng(2)
    spec = IndexSpec("flat", "cosine", {}, D)
    c = Collection.create(tmp_path / "sel", VectorsConfig.single(spec, MODEL), exact_filter_threshold=10)
    X = unit(rng, 400)
    c.upsert(list(range(400)), ["t"] * 400, [{"g": i % 2} for i in range(400)], X)
    evens = [i for i in range(400) if i % 2 == 0]
    for qi in range(3):
        got = [h.id for h in c.search(X[qi : qi + 1], 10, parse_filter({"g": 0}))[0]]
        assert got == brute(X[qi], X[evens], evens, 10)
    c.close()


@pytest.mark.parametrize("kind,params", KINDS)
def test_restart_restores_from_snapshot_and_replay(tmp_path, kind, params):
    rng = np.random.default_rng(3)
    c = make(tmp_path, kind, **params)
    X = unit(rng, 500)
    c.upsert(list(range(500)), [str(i) for i in range(500)], [{"i": i} for i in range(500)], X)
    if c.needs_maintenance():
        c.maintain()
    c.delete(ids=[0, 1, 2])
    snap_seq = c.snapshot()
    assert snap_seq == c.seq
    # writes after the snapshot: replay must apply them (removals included)
    Y = unit(rng, 3)
    c.upsert([3, 600, 601], ["a", "b", "c"], [None, None, None], Y)
    c.delete(ids=[10])
    before = [[h.id for h in q] for q in c.search(X[:30], 10)]
    seq, path = c.seq, c.path
    c.close()
    c2 = Collection.open(path)
    assert c2.info()["snapshot_sequence"] == snap_seq  # loaded from the snapshot (not the rebuild fallback) ...
    assert c2.changes_since_snapshot() == 2  # ... and replayed the two writes after it
    assert c2.seq == seq and c2.count == 500 - 3 - 1 + 2 == c2.index.live
    assert c2.index.trained is True
    assert [[h.id for h in q] for q in c2.search(X[:30], 10)] == before
    assert c2.search(Y[:1], 1)[0][0].id == 3
    assert c2.get(10) is None and c2.get(601)["text"] == "c"
    c2.close()


def test_corrupt_snapshot_rebuilds_from_sqlite(tmp_path):
    rng = np.random.default_rng(4)
    c = make(tmp_path, "hnsw")
    X = unit(rng, 200)
    c.upsert(list(range(200)), ["t"] * 200, [None] * 200, X)
    c.snapshot()
    path = c.path
    c.close()
    snap = next(path.glob("index-*.snap"))
    data = bytearray(snap.read_bytes())
    data[-100] ^= 0xFF
    snap.write_bytes(bytes(data))
    c2 = Collection.open(path)
    assert c2.info()["snapshot_sequence"] == 0  # snapshot rejected, rebuilt from SQLite
    assert c2.count == 200 and c2.search(X[:1], 1)[0][0].id == 0
    c2.close()


def test_rows_written_after_a_snapshot_are_found_by_their_write_sequence(tmp_path):
    rng = np.random.default_rng(6)
    c = make(tmp_path, "hnsw")
    c.upsert(list(range(200)), ["t"] * 200, [None] * 200, unit(rng, 200))
    seq = c.snapshot()
    c.upsert(list(range(150, 260)), ["t"] * 110, [None] * 110, unit(rng, 110))  # 50 replaced, 60 new
    got = list(c.store.iter_vectors(D, after_seq=seq, chunk=16))
    ids, vecs = np.concatenate([i for i, _ in got]), np.concatenate([v for _, v in got])
    rows = c.store.reader().execute("SELECT iid, vector FROM points WHERE seq > ? ORDER BY iid", (seq,)).fetchall()
    assert len(got) == 7 and len(ids) == len(rows) == 110 and np.all(np.diff(ids) > 0)
    assert ids.tolist() == [r[0] for r in rows]
    assert np.array_equal(vecs, np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(-1, D))
    c.close()


def test_hnsw_tombstones_then_rebuild(tmp_path):
    rng = np.random.default_rng(5)
    c = make(tmp_path, "hnsw", rebuild_fraction=0.1)
    X = unit(rng, 300)
    c.upsert(list(range(300)), ["t"] * 300, [None] * 300, X)
    c.delete(ids=list(range(20)))
    assert c.index.n_tombstones == 20 and not c.needs_maintenance()
    assert all(h.id >= 20 for q in c.search(X[:20], 10) for h in q)
    c.delete(ids=list(range(20, 40)))
    assert c.needs_maintenance()
    assert c.maintain() == "rebuilt the unnamed vector as hnsw (tombstones)"
    assert c.index.n_tombstones == 0 and c.index.ntotal == 260 == c.count
    assert c.search(X[50:51], 1)[0][0].id == 50
    c.close()


def test_small_indexes_are_searched_exactly_in_memory(tmp_path):
    """An index holding at most ``exact_filter_threshold`` live vectors is searched exactly, from the vectors the
    HNSW graph holds (deleted points left out), as a Qdrant segment under its indexing threshold is; past the
    threshold the graph answers (approximately: a sparse graph misses true neighbours)."""
    rng = np.random.default_rng(12)
    c = make(tmp_path, "hnsw", M=4, ef_construction=8, ef_search=1)
    n = 3000
    X = unit(rng, n)
    c.upsert(list(range(n)), ["t"] * n, [None] * n, X)
    c.delete(ids=list(range(0, n, 3)))
    live = np.array([i for i in range(n) if i % 3])
    Q = unit(rng, 30)
    exact = [list(live[np.argsort(-(X[live] @ q), kind="stable")[:10]]) for q in Q]
    found = [[h.id for h in hits] for hits in c.search(Q, 10)]
    assert found == exact
    assert c.search(Q[:1], 1)[0][0].score == pytest.approx(float((X[live] @ Q[0]).max()), abs=1e-6)
    c.exact_filter_threshold = 0
    assert [[h.id for h in hits] for hits in c.search(Q, 10)] != exact
    c.close()


def test_l2_and_dot_metrics(tmp_path):
    rng = np.random.default_rng(6)
    X = rng.standard_normal((100, D)).astype(np.float32)
    for metric in ("l2", "dot"):
        c = make(tmp_path, "flat", metric)
        c.upsert(list(range(100)), ["t"] * 100, [None] * 100, X)
        q = X[:1] + 0.01
        h = c.search(q, 3)[0]
        if metric == "l2":
            d = np.linalg.norm(X - q, axis=1)
            assert [x.id for x in h] == list(np.argsort(d)[:3])
            assert h[0].score == pytest.approx(d.min(), rel=1e-4)
            assert all(x.score <= d.min() + 1e-5 for x in c.search(q, 10, score_threshold=float(d.min()) + 1e-6)[0])
        else:
            assert [x.id for x in h] == list(np.argsort(-(X @ q[0]))[:3])
        c.close()


def test_index_params_validated():
    with pytest.raises(IndexConfigError):
        normalize_params("ivf_pq", {"m": 7}, 384)
    with pytest.raises(IndexConfigError):
        normalize_params("hnsw", {"M": 2}, 384)
    with pytest.raises(IndexConfigError):
        normalize_params("flat", {"M": 16}, 384)
    with pytest.raises(IndexConfigError):
        normalize_params("hnsw", {"efSearch": 16}, 384)
    assert normalize_params("ivf_pq", {"nlist": 4}, 384)["nprobe"] == 4
    for nlist, sample in ((1024, 65_536), (4096, 200_000), (16_384, 39 * 16_384)):  # k-means: >= 39 per centroid
        assert normalize_params("ivf_pq", {"nlist": nlist}, 384)["train_sample"] == sample


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_searches_never_see_half_applied_writes(tmp_path, kind):
    """A writer replaces a group of 50 points in one upsert, repeatedly; concurrent searches
    asking for every point must see the group at one version only, and (exact flat
    index) exactly every point."""
    rng = np.random.default_rng(7)
    c = make(tmp_path, kind)
    n, group = 200, list(range(50))
    X = unit(rng, n)
    c.upsert(list(range(n)), ["t"] * n, [{"v": 0}] * n, X)
    stop = threading.Event()
    errors: list[str] = []

    def writer():
        v = 0
        while not stop.is_set() and v < 60:
            v += 1
            c.upsert(group, ["t"] * 50, [{"v": v}] * 50, unit(rng, 50))

    def reader():
        while not stop.is_set():
            hits = c.search(X[:1], n)[0]
            vs = {h.payload["v"] for h in hits if h.id in set(group)}
            if (kind == "flat" and len(hits) != n) or len(vs) != 1:
                errors.append(f"{len(hits)} hits, group versions {sorted(vs)}")

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    w = threading.Thread(target=writer)
    w.start()
    w.join(timeout=120)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors[:5]
    assert c.count == n and c.index.live == n
    assert c.index.n_tombstones == (60 * 50 if kind == "hnsw" else 0)
    c.close()


def test_store_counts_and_sequence(tmp_path):
    c = make(tmp_path, "flat")
    X = unit(np.random.default_rng(8), 5)
    s1 = c.upsert([1, 2, 3], ["a", "b", "c"], [None] * 3, X[:3])
    (s2,) = [c.delete(ids=[2])[1]]
    s3 = c.upsert([1], ["a2"], [None], X[3:4])
    assert s1 < s2 < s3 == c.seq
    st = Store(c.path)
    assert st.count() == 2 and st.seq() == s3
    assert sorted(st.removed_after(0).tolist()) == [1, 2]  # iid of id 2, then the replaced iid of id 1
    st.close()
    c.close()


def test_a_new_file_has_pages_that_fit_vector_rows_and_an_older_file_keeps_its_own(tmp_path, monkeypatch):
    """New collection files use ``files.PAGE_SIZE`` (16 KiB: rows of 384 floats fill the pages, not 2 of 4 KiB);
    a file created with SQLite's default 4 KiB pages (as every collection before) opens, writes and searches as
    before, and keeps its page size."""
    from service.collections.embedded.store import files

    def pages(c: Collection) -> int:
        return c.store._w.execute("PRAGMA page_size").fetchone()[0]

    X = unit(np.random.default_rng(3), 20)
    new = make(tmp_path, "flat")
    monkeypatch.setattr(files, "PAGE_SIZE", 4096)
    old = make(tmp_path, "flat", "dot")
    assert (pages(new), pages(old)) == (16384, 4096)
    old.upsert(list(range(10)), ["t"] * 10, [None] * 10, X[:10])
    path = old.path
    old.close()
    monkeypatch.undo()
    again = Collection.open(path)
    again.upsert(list(range(10, 20)), ["t"] * 10, [None] * 10, X[10:])
    assert pages(again) == 4096 and again.count == 20
    assert [h.id for h in again.search(X[15:16], 1)[0]] == [15]
    again.close()
    new.close()


def reopened_without(c: Collection, index: str) -> Path:
    """Close ``c`` and drop one of its store's indexes, as a collection written before that index existed; returns
    its path (the next ``Store`` opened there builds the index again)."""
    path = c.path
    c.close()
    st = Store(path)
    st._w.execute(f"DROP INDEX {index}")
    st.close()
    return path


def test_payload_filters_scan_the_covering_index_not_the_vectors(tmp_path):
    """A filter reads payload and key only: SQLite must scan ``points_filter`` (no vectors) instead of the table,
    and a collection written before that index existed gets it when it opens."""
    from service.collections.embedded.store.where import to_sql

    c = make(tmp_path, "flat")
    X = unit(np.random.default_rng(9), 40)
    c.upsert(list(range(40)), [f"t{i}" for i in range(40)], [{"g": i % 4, "tags": [i]} for i in range(40)], X)
    path = reopened_without(c, "points_filter")

    st = Store(path)
    for f in ({"g": 1}, {"tags": {"$in": [3, 5]}}, {"$or": [{"g": 2}, {"$ids": [7]}]}):
        sql, params = to_sql(parse_filter(f))
        plan = " ".join(
            r[3] for r in st.reader().execute(f"EXPLAIN QUERY PLAN SELECT iid FROM points WHERE {sql}", params)
        )
        assert "COVERING INDEX points_filter" in plan, (f, plan)
    assert len(st.matching_iids(parse_filter({"g": 1}))) == 10
    st.close()


def test_scroll_walks_ids_in_qdrants_order_through_an_index(tmp_path):
    """Scroll pages follow Qdrant's point order (integer ids numerically, then string ids), page after page from an
    inclusive start, through the ``points_order`` index (built when a collection from before it opens)."""
    c = make(tmp_path, "flat")
    ids = [10, 2, 18446744073709551615, 0, "b", "10", 100, "0f0e0d0c-0000-0000-0000-000000000000", 1, "a"]
    X = unit(np.random.default_rng(3), len(ids))
    c.upsert(ids, [str(i) for i in ids], [{"odd": isinstance(i, int) and i % 2 == 1} for i in ids], X)
    expected = [0, 1, 2, 10, 100, 18446744073709551615, "0f0e0d0c-0000-0000-0000-000000000000", "10", "a", "b"]
    pages, start = [], None
    while True:
        rows = c.scroll(start, 4)
        pages += [r["id"] for r in rows[:3]]
        if len(rows) < 4:
            break
        start = rows[3]["id"]
    assert pages == expected
    assert [r["id"] for r in c.scroll(2, 10, parse_filter({"odd": False}))] == [2, 10, 100, *expected[6:]]
    path = reopened_without(c, "points_order")
    st = Store(path)
    q = f"EXPLAIN QUERY PLAN SELECT key FROM points ORDER BY {ORDER_KEY} LIMIT 3"
    plan = " ".join(r[3] for r in st.reader().execute(q))
    assert "points_order" in plan, plan
    assert [k for k, *_ in st.scroll("100", 2, None, False)] == ["100", "18446744073709551615"]
    st.close()


def test_a_crash_right_after_a_model_switch_never_loads_the_old_vectors(tmp_path, monkeypatch):
    """The switch keeps the sequence number: a snapshot of the old model's vectors left on disk would load as if it
    held the new ones. The switch removes them before it commits, so a crash just after the commit rebuilds."""
    from service.collections.embedded.store.shadow import ShadowTable

    rng = np.random.default_rng(0)
    c = make(tmp_path, "flat")
    old = unit(rng, 20)
    c.upsert(list(range(20)), ["t"] * 20, [None] * 20, old, model=MODEL)
    assert c.snapshot() is not None
    new_model = {**MODEL, "version": "2", "sha256": "b" * 64}
    target = c.begin_reembed(new_model, D)
    rows, _ = target.pending(None, 100)
    new = -old  # the new model's vectors, far from the old ones
    assert len(rows) == 20  # by internal id, in the order the points were written
    target.write([r[0] for r in rows], new)
    promote = ShadowTable.promote

    def promote_then_crash(self, *a, **kw):
        promote(self, *a, **kw)
        raise SystemExit("crash right after the switch committed")

    monkeypatch.setattr(ShadowTable, "promote", promote_then_crash)
    with pytest.raises(SystemExit):
        target.complete()
    reopened = Collection.open(c.path)
    assert reopened.model["version"] == "2" and reopened.count == 20
    hits = reopened.search(new[:3], 1)
    assert [h[0].id for h in hits] == [0, 1, 2]  # the index holds the new vectors
    assert [round(h[0].score, 4) for h in hits] == [1.0, 1.0, 1.0]


def test_the_switch_and_the_completed_state_are_one_change_for_readers(tmp_path):
    """GET /collections/{name} reads the model and the re-embedding's state together: the switch marks the state
    completed under the lock that swaps the model (the snapshot after it and the re-embedder's own bookkeeping take
    seconds on a large collection, and a reader must not see the new model beside a "running" state meanwhile)."""
    rng = np.random.default_rng(0)
    c = make(tmp_path, "flat")
    c.upsert(list(range(20)), ["t"] * 20, [None] * 20, unit(rng, 20), model=MODEL)
    target = c.begin_reembed({**MODEL, "version": "2", "sha256": "b" * 64}, D)
    assert c.info()["reembedding"]["state"] == "running"
    rows, _ = target.pending(None, 100)
    target.write([r[0] for r in rows], unit(rng, 20))
    assert target.complete()
    info = c.info()
    assert info["model"]["version"] == "2"
    assert (info["reembedding"]["state"], info["reembedding"]["done"], info["reembedding"]["total"]) == (
        "completed", 20, 20,
    )  # fmt: skip
    c.close()


def test_set_payload_never_writes_back_vectors_of_a_model_switched_away(tmp_path):
    """set_payload writes each page back with its stored vectors; a switch that completes between the read and the
    write makes it read the page again (the new model's vectors), not store the old ones under the new model."""
    import asyncio

    from service.collections.embedded.backend import EmbeddedBackend
    from service.collections.service import CollectionService
    from service.collections.vector_backend import CollectionSettings
    from service.inference_port import InferenceAdapter
    from service.settings import Settings

    async def run() -> tuple[list[float], dict]:
        backend = EmbeddedBackend(tmp_path / "root", CollectionSettings(Settings()))
        backend.root.mkdir(parents=True, exist_ok=True)
        svc = CollectionService(backend, InferenceAdapter(lambda: None, None, {}))
        c = await backend.create("c", single_config("c", "flat", None, "cosine", MODEL, 4))
        eye = np.eye(4, dtype=np.float32)
        await svc.upsert("c", [1, 2, 3, 4], ["a", "b", "c", "d"], [None] * 4, eye.tolist())
        target = c.begin_reembed({**MODEL, "version": "2", "sha256": "b" * 64}, 4)
        rows, _ = target.pending(None, 100)
        target.write([r[0] for r in rows], -eye)  # the new model's vectors
        read, switched = svc.scroll, []

        async def scroll_then_switch(*a, **kw):  # the switch completes right after the first page was read
            page = await read(*a, **kw)
            if not switched:
                switched.append(await backend.run(target.complete))
            return page

        svc.scroll = scroll_then_switch
        await svc.set_payload("c", [1], None, {"w": 1}, True)
        return c.get(1, True)["vector"], c.get(1)["payload"], c.model

    vector, payload, model = asyncio.run(run())
    assert model["version"] == "2" and payload == {"w": 1}
    assert vector == [-1.0, 0.0, 0.0, 0.0]  # the new model's vector, not the old [1, 0, 0, 0]


def test_a_set_payload_refused_for_size_changes_nothing(tmp_path):
    """Every merged payload is size-checked before the first write: a later page over the limit used to leave the
    earlier pages updated behind a 422."""
    import asyncio

    from service.collections.embedded.backend import EmbeddedBackend
    from service.collections.errors import InvalidCollectionRequest
    from service.collections.service import CollectionService
    from service.collections.vector_backend import CollectionSettings
    from service.inference_port import InferenceAdapter
    from service.settings import Settings

    async def run() -> list:
        small = Settings(
            collections_max_payload_bytes=100, collections_max_top_k=2, collections_max_points_per_request=2
        )
        backend = EmbeddedBackend(tmp_path / "root", CollectionSettings(small))
        backend.root.mkdir(parents=True, exist_ok=True)
        svc = CollectionService(backend, InferenceAdapter(lambda: None, None, {}))
        c = await backend.create("c", single_config("c", "flat", None, "cosine", MODEL, 4))
        payloads = [{"x": 1}, {"x": 2}, {"x": 3}, {"x": "y" * 80}]  # the last one has room for little more
        for i in (0, 2):
            await svc.upsert("c", [i + 1, i + 2], ["a", "b"], payloads[i : i + 2], np.eye(4)[i : i + 2].tolist())
        with pytest.raises(InvalidCollectionRequest, match="merged into point 4") as e:
            await svc.set_payload("c", None, None, {"z": "q" * 15}, True)  # pages of 2 points: 1-2, then 3-4
        assert e.value.param == "payload"
        await svc.set_payload("c", [1, 2], None, {"z": "ok"}, True)  # within the limit: applied
        return [c.get(i)["payload"] for i in (1, 2, 3, 4)]

    assert asyncio.run(run()) == [{"x": 1, "z": "ok"}, {"x": 2, "z": "ok"}, {"x": 3}, {"x": "y" * 80}]


def test_named_dense_and_sparse_vectors_are_durable_and_go_with_their_point(tmp_path):
    """Client-supplied dense and sparse vectors are written in the upsert's transaction: a second open of the
    directory while the first is still open (what a restart after SIGKILL reads) answers the same; replacing or
    deleting a point removes its named vectors from the indexes and from the IDF statistics."""
    from service.collections.schema import DenseVector, SparseVec, SparseVector

    def sv(idx, vals):
        return SparseVec(np.asarray(idx, np.uint32), np.asarray(vals, np.float32))

    cfg = VectorsConfig(
        {"": DenseVector("", IndexSpec("flat", "cosine", {}, 4), MODEL),
         "img": DenseVector("img", IndexSpec("hnsw", "dot", normalize_params("hnsw", {}, 3), 3))},
        {"kw": SparseVector("kw", "idf")},
    )  # fmt: skip
    c = Collection.create(tmp_path / "c", cfg)
    base = np.eye(4, dtype=np.float32)[:3]
    named = [{"img": np.array([1, 0, 0], np.float32), "kw": sv([5, 1], [1, 2])},
             {"kw": sv([1, 7], [1, 1])}, {"img": np.array([0, 1, 0], np.float32)}]  # fmt: skip
    c.upsert([1, 2, 3], ["a", "b", "c"], [None] * 3, base, model=MODEL, named=named)

    def answers(col):
        img = col.search(np.array([[1, 0.5, 0]], np.float32), 5, using="img")[0]
        kw = col.search([sv([1, 5], [1, 1])], 5, using="kw")[0]
        return [(h.id, round(h.score, 5)) for h in img], [(h.id, round(h.score, 5)) for h in kw]

    img, kw = answers(c)
    assert img == [(1, 1.0), (3, 0.5)]
    # IDF over the 2 points holding kw: term 1 in both, term 5 in one (Qdrant's formula)
    idf1, idf5 = np.log1p((2 - 2 + 0.5) / 2.5), np.log1p((2 - 1 + 0.5) / 1.5)
    assert kw == [(1, round(2 * idf1 + idf5, 5)), (2, round(idf1, 5))]
    assert answers(Collection.open(tmp_path / "c")) == (img, kw)  # read by a second process-like open
    c.upsert([1], ["a2"], [None], base[:1], model=MODEL)  # replaced without named vectors
    c.delete([2])
    img, kw = answers(c)
    assert img == [(3, 0.5)] and kw == []
    assert c.named.counts == {"img": 1, "kw": 0}
    again = Collection.open(tmp_path / "c")
    assert answers(again) == (img, kw) and again.named.counts == {"img": 1, "kw": 0}
    assert c.get(3, with_vector=["img"])["vectors"] == {"img": [0.0, 1.0, 0.0]}


@pytest.mark.parametrize("catch_up_rows", [5, 10_000])
def test_a_client_supplied_vector_is_trained_and_rebuilt_beside_writes(tmp_path, monkeypatch, catch_up_rows):
    """A client-supplied (named) vector gets the upkeep the model-bound one gets: IVF-PQ training once enough points
    are stored, an HNSW rebuild once tombstones pass ``rebuild_fraction``; each built beside (a write made while it
    is built is in the index swapped in: caught up without the write mutex when it is at least ``CATCH_UP_ROWS``
    points, else replayed under it) and answering as before."""
    from service.collections.embedded import maintenance
    from service.collections.schema import DenseVector

    monkeypatch.setattr(maintenance, "CATCH_UP_ROWS", catch_up_rows)

    rng = np.random.default_rng(7)
    ivf = IndexSpec("ivf_pq", "cosine", normalize_params("ivf_pq", {"nlist": 8, "m": 8, "min_train_points": 300}, D), D)
    hnsw = IndexSpec("hnsw", "cosine", normalize_params("hnsw", {"rebuild_fraction": 0.1}, D), D)
    c = Collection.create(tmp_path / "c", VectorsConfig({"a": DenseVector("a", ivf), "b": DenseVector("b", hnsw)}))
    X, Y = unit(rng, 400), unit(rng, 400)

    def put(ids):
        c.upsert(ids, ["t"] * len(ids), [{}] * len(ids), None, named=[{"a": X[i], "b": Y[i]} for i in ids])

    put(list(range(200)))
    assert not c.needs_maintenance()
    put(list(range(200, 350)))
    assert c.needs_maintenance() and not c.named.indexes["a"].trained
    rows = c._rows  # a write lands while the new index is built beside (between the build and the swap)

    def rows_then_write(name, dim, upto_iid=None, after=(-1, 0)):
        if after == (-1, 0) and name == "a":
            yield from rows(name, dim, upto_iid, after)
            t = threading.Thread(target=put, args=(list(range(350, 360)),))
            t.start()
            t.join()  # the write mutex is free while the index is built
            return
        yield from rows(name, dim, upto_iid, after)

    c._rows = rows_then_write
    assert c.maintain() == "rebuilt 'a' as ivf_pq (trained)"
    c._rows = rows
    put(list(range(360, 400)))
    a = c.named.indexes["a"]
    assert a.trained and a.live == 400 and not c.needs_maintenance()
    assert all(c.search(X[i : i + 1], 1, using="a")[0][0].id == i for i in range(0, 400, 41))
    c.delete(ids=list(range(60)))
    assert c.named.indexes["b"].n_tombstones == 60 and c.needs_maintenance()
    assert c.maintain() == "rebuilt 'b' as hnsw (tombstones)"
    b = c.named.indexes["b"]
    assert b.n_tombstones == 0 and b.live == 340 and not c.needs_maintenance()
    assert [h.id for h in c.search(Y[100:101], 1, using="b")[0]] == [100]
    # snapshots: an open loads the trained index and the graph from them and replays the later writes (no k-means, no
    # graph build); what the snapshot does not cover (a write, a delete after it) is replayed from the store
    seq = c.snapshot()
    assert seq is not None and c.named.snapshot_seq == seq
    put([5])  # replaced: a fresh internal id
    c.delete(ids=[100])
    want = [
        [h.id for h in c.search(M[i : i + 1], 3, using=u)[0]] for u, M in (("a", X), ("b", Y)) for i in (5, 200, 300)
    ]
    again = Collection.open(tmp_path / "c")  # a second open while the first is live: what a restart after SIGKILL reads
    a2, b2 = again.named.indexes["a"], again.named.indexes["b"]
    assert again.named.snapshot_seqs == {"a": seq, "b": seq} and a2.trained and not again.needs_maintenance()
    assert (a2.live, b2.live, b2.n_tombstones) == (340, 340, 1)  # point 100: a tombstone in the graph
    got = [
        [h.id for h in again.search(M[i : i + 1], 3, using=u)[0]]
        for u, M in (("a", X), ("b", Y))
        for i in (5, 200, 300)
    ]
    assert got == want and all(100 not in g for g in got)
    again.close()
    c.close()


def test_the_model_bound_index_is_trained_beside_writes(tmp_path, monkeypatch):
    """The model-bound vector's IVF training is built beside as a client-supplied vector's is: a write made while the
    k-means runs does not wait for it (the write mutex is free), and the index swapped in holds it."""
    from service.collections.embedded import maintenance

    monkeypatch.setattr(maintenance, "CATCH_UP_ROWS", 5)
    rng = np.random.default_rng(11)
    c = make(tmp_path, "ivf_pq", nlist=8, m=8, min_train_points=300)
    X = unit(rng, 400)
    c.upsert(list(range(350)), ["t"] * 350, [None] * 350, X[:350])
    assert c.needs_maintenance() and not c.index.trained and c.info()["indexing"] == [""]
    rows = c._rows

    def rows_then_write(name, dim, upto_iid=None, after=(-1, 0)):
        yield from rows(name, dim, upto_iid, after)
        if after == (-1, 0):  # the build has read the stored points: a write lands before the swap
            t = threading.Thread(target=c.upsert, args=(list(range(350, 380)), ["t"] * 30, [None] * 30, X[350:380]))
            t.start()
            t.join(timeout=30)
            assert not t.is_alive()  # it did not wait for the k-means

    c._rows = rows_then_write
    assert c.maintain() == "rebuilt the unnamed vector as ivf_pq (trained)"
    c._rows = rows
    c.upsert(list(range(380, 400)), ["t"] * 20, [None] * 20, X[380:])
    assert c.index.trained and c.index.live == 400 == c.count and not c.needs_maintenance()
    assert all(c.search(X[i : i + 1], 1)[0][0].id == i for i in (3, 351, 379, 399))
    c.close()
