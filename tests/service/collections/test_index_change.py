"""A dense vector's index changed on an existing embedded collection (service/collections/index_change.py, the
collection's maintenance): the model-bound vector given scalar quantization and back. The config is durable at once
(its old FAISS snapshots gone first), the old index answers until maintenance swaps the rebuilt one in, then the
codes are used (``rescore: false`` scores approximate, rescored ones exact), and a reopen keeps it. The Qdrant route
(``PATCH`` with qdrant-client, a client-supplied vector): tests/service/http/qdrant/test_qdrant_quantization.py."""

from __future__ import annotations

import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.errors import InvalidCollectionRequest
from service.collections.index import IndexSpec, normalize_params
from service.collections.index_change import with_indexes
from service.collections.query_model import QuantizationSearch
from service.collections.schema import VectorsConfig

N, D, K = 1500, 32, 10
MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}
NO_RESCORE = QuantizationSearch(rescore=False)


def score_error(c: Collection, X: np.ndarray, Q: np.ndarray, quantization=None) -> float:
    hits = c.search(Q, K, with_payload=False, with_text=False, quantization=quantization)
    return max(
        float(np.abs(np.array([h.score for h in row]) - (X @ q)[[h.id for h in row]]).max()) for q, row in zip(Q, hits)
    )


def test_the_bound_vectors_index_changes_in_the_background_and_stays(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((N, D)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Q = X[:5] + 0.1
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    path = tmp_path / "c"
    c = Collection.create(path, VectorsConfig.single(IndexSpec("flat", "cosine", {}, D), MODEL))
    c.upsert(list(range(N)), [""] * N, [{}] * N, X)
    assert c.snapshot() and list(path.glob("index-*.snap"))
    with pytest.raises(InvalidCollectionRequest):
        c.update_vectors(lambda cfg: with_indexes(cfg, {"nope": ("flat_sq", {})}))
    c.update_vectors(lambda cfg: with_indexes(cfg, {"": ("flat_sq", {"quantization": {"quantile": 0.99}})}))
    assert not list(path.glob("index-*.snap"))  # an index of the old config is never loaded again
    assert c.info()["rebuilding"] == [""] and c.info()["vectors"]["dense"][""]["index"] == "flat_sq"
    assert c.index.spec.kind == "flat" and score_error(c, X, Q, NO_RESCORE) < 1e-5  # the old index answers
    assert c.needs_maintenance() and "flat_sq" in c.maintain()
    assert c.info()["rebuilding"] == [] and c.index.quantized
    assert score_error(c, X, Q, NO_RESCORE) > 1e-4 and score_error(c, X, Q) < 1e-5
    c.upsert([N], [""], [{}], X[:1])  # writes go on into the new index
    X = np.vstack([X, X[:1]])
    c.close()
    c = Collection.open(path)
    try:
        assert c.index.spec.kind == "flat_sq" and c.index.quantized and c.count == N + 1
        assert c.index.spec.params["quantization"]["quantile"] == 0.99
        c.update_vectors(lambda cfg: with_indexes(cfg, {"": ("flat", {})}))  # and back
        assert c.maintain() and c.index.spec.kind == "flat" and score_error(c, X, Q, NO_RESCORE) < 1e-5
        assert c.update_vectors(lambda cfg: with_indexes(cfg, {"": ("flat", {})})) is None  # no change
    finally:
        c.close()
    c = Collection.open(path)
    try:
        assert c.index.spec.kind == "flat" and c.info()["rebuilding"] == []
    finally:
        c.close()


def test_a_spec_that_does_not_normalise_is_refused():
    spec = IndexSpec("hnsw", "cosine", normalize_params("hnsw", {}, D), D)
    cfg = VectorsConfig.single(spec, MODEL)
    with pytest.raises(InvalidCollectionRequest):
        with_indexes(cfg, {"": ("hnsw_sq", {"quantization": {"type": "binary"}})})
    assert with_indexes(cfg, {"": ("hnsw", {})}) is None


def test_writes_go_on_while_the_index_is_rebuilt_and_are_in_it(tmp_path, monkeypatch):
    """The build of the new index held open (its build function waits) while points are added, replaced and deleted
    and a snapshot is taken: none of them waits for it, and the index swapped in holds exactly the live points
    (each found as its own nearest, the deleted ones never)."""
    import threading

    from service.collections.index import VectorIndex

    rng = np.random.default_rng(4)
    X = rng.standard_normal((N + 100, D)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    c = Collection.create(tmp_path / "c", VectorsConfig.single(IndexSpec("flat", "cosine", {}, D), MODEL))
    c.upsert(list(range(N)), [""] * N, [{}] * N, X[:N])
    c.update_vectors(lambda cfg: with_indexes(cfg, {"": ("flat_sq", {})}))
    built, release, build = threading.Event(), threading.Event(), VectorIndex.build

    def held_build(spec, chunks, train_sample=None):
        out = build(spec, chunks, train_sample=train_sample)
        built.set()
        assert release.wait(30)
        return out

    monkeypatch.setattr(VectorIndex, "build", held_build)
    t = threading.Thread(target=lambda: c.maintain())
    t.start()
    try:
        assert built.wait(30)
        c.upsert(list(range(N, N + 50)), [""] * 50, [{}] * 50, X[N : N + 50])  # new points
        c.upsert(list(range(20)), [""] * 20, [{}] * 20, X[N + 50 : N + 70])  # replaced: new vectors
        c.delete(list(range(20, 50)))
        assert c.snapshot()  # keeps the removals the rebuild replays
        assert not release.is_set() and c.info()["rebuilding"] == [""]
    finally:
        release.set()
        t.join()
    truth = {i: X[i] for i in range(50, N + 50)} | {i: X[N + 50 + i] for i in range(20)}
    assert c.info()["rebuilding"] == [] and c.index.quantized and c.index.live == c.count == len(truth)
    probe = [*range(20), *range(20, 50), *range(N, N + 50), *range(50, 1000, 50)]
    hits = c.search(np.stack([truth.get(i, X[i]) for i in probe]), 3, with_payload=False, with_text=False)
    for i, row in zip(probe, hits):
        assert (row[0].id == i and row[0].score > 0.999) if i in truth else all(h.id != i for h in row)
    c.close()
