"""A named vector added to or deleted from an existing collection (Qdrant's create_vector_name / delete_vector_name):
the policy (:mod:`service.collections.vector_names`), the embedded collection's durable change (reopened as a restart
reads it: the config and the values together), and the milvus backend's refusal. The service routes, REST and gRPC
against qdrant-client's local mode: tests/service/http/qdrant/test_qdrant_vector_names.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.errors import InvalidCollectionRequest
from service.collections.filters import parse_filter
from service.collections.index import IndexSpec
from service.collections.schema import MAX_VECTORS, DenseVector, SparseVec, SparseVector, VectorsConfig
from service.collections.vector_backend import CollectionSettings
from service.collections.vector_names import with_vector, without_vector
from service.http.qdrant.collections import collection_info
from service.settings import Settings

MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}
IMG = {"size": 3, "metric": "dot", "index": "flat"}


def sv(idx, vals) -> SparseVec:
    return SparseVec(np.asarray(idx, np.uint32), np.asarray(vals, np.float32))


def bound_config() -> VectorsConfig:
    return VectorsConfig({"": DenseVector("", IndexSpec("flat", "cosine", {}, 4), MODEL)})


def test_the_policy_follows_qdrant():
    cfg = bound_config()
    with_img = with_vector(cfg, "img", dense=IMG)
    assert set(with_img.dense) == {"", "img"} and not with_img.dense["img"].bound
    assert with_vector(with_img, "img", dense={**IMG, "index": "hnsw"}) is None  # same definition: nothing to do
    for other in ({**IMG, "size": 4}, {**IMG, "metric": "cosine"}, {**IMG, "multivector": True}):
        with pytest.raises(InvalidCollectionRequest, match="another definition"):
            with_vector(with_img, "img", dense=other)
    with pytest.raises(InvalidCollectionRequest, match="dense vector named 'img'"):
        with_vector(with_img, "img", sparse={"modifier": "idf"})
    kw = with_vector(with_img, "kw", sparse={"modifier": "idf"})
    assert kw.sparse["kw"].modifier == "idf" and with_vector(kw, "kw", sparse={"modifier": "idf"}) is None
    with pytest.raises(InvalidCollectionRequest, match="another definition"):
        with_vector(kw, "kw", sparse={"modifier": "none"})
    with pytest.raises(InvalidCollectionRequest, match="supplied by the client"):
        with_vector(cfg, "m", dense={"bound": True})
    with pytest.raises(InvalidCollectionRequest, match="exactly one"):
        with_vector(cfg, "x")
    with pytest.raises(InvalidCollectionRequest, match="size"):
        with_vector(cfg, "x", dense={"size": 0})
    with pytest.raises(InvalidCollectionRequest, match="vector name"):
        with_vector(cfg, 'a"b', dense=IMG)
    many = VectorsConfig({f"v{i}": DenseVector(f"v{i}", IndexSpec("flat", "dot", {}, 2)) for i in range(MAX_VECTORS)})
    with pytest.raises(InvalidCollectionRequest, match=f"at most {MAX_VECTORS}"):
        with_vector(many, "one_more", dense=IMG)
    assert without_vector(kw, "nope") is None  # a name the collection lacks: nothing to do
    assert set(without_vector(kw, "img").dense) == {""} and set(without_vector(kw, "kw").sparse) == set()
    with pytest.raises(InvalidCollectionRequest, match="model-bound"):
        without_vector(kw, "")
    unnamed = VectorsConfig({"": DenseVector("", IndexSpec("flat", "dot", {}, 3))}, {"s": SparseVector("s")})
    with pytest.raises(InvalidCollectionRequest, match="only dense vector"):
        without_vector(unnamed, "")
    assert without_vector(unnamed, "s") is not None


def test_an_added_or_deleted_vector_is_durable_with_its_values(tmp_path):
    """The config change and the removal of the values are one transaction: a second open of the directory (what a
    restart reads) sees the new vectors, the points hold no value of one added, and one deleted then added again
    starts empty."""
    c = Collection.create(tmp_path / "c", bound_config())
    base = np.eye(4, dtype=np.float32)[:3]
    c.upsert([1, 2, 3], ["a", "b", "c"], [None] * 3, base, model=MODEL)
    c.update_vectors(lambda cfg: with_vector(cfg, "img", dense=IMG))
    c.update_vectors(lambda cfg: with_vector(cfg, "kw", sparse={"modifier": "idf"}))
    c.update_vectors(lambda cfg: with_vector(cfg, "multi", dense={**IMG, "multivector": True}))
    assert c.get(1, with_vector=True)["vectors"] == {}  # stored before: holds none of them
    has_img = parse_filter({"$has_vector": "img"}, 100, {"": "bound", "img": "dense", "kw": "sparse"})
    assert c.count_matching(has_img) == 0
    named = [{"img": np.array([1, 0, 0], np.float32), "kw": sv([1, 5], [1, 2]),
              "multi": np.array([[0, 1, 0], [1, 0, 0]], np.float32)}, {"img": np.array([0, 1, 0], np.float32)}]  # fmt: skip
    c.upsert([2, 3], ["b", "c"], [None] * 2, base[1:], model=MODEL, named=named)

    def answers(col):
        img = col.search(np.array([[1, 0.5, 0]], np.float32), 5, using="img")[0]
        kw = col.search([sv([1], [1])], 5, using="kw")[0]
        multi = col.search([np.array([[1, 0, 0]], np.float32)], 5, using="multi")[0]
        return [(h.id, round(h.score, 4)) for h in img], [h.id for h in kw], [h.id for h in multi]

    assert answers(c) == ([(2, 1.0), (3, 0.5)], [2], [2])
    c.update_vectors(lambda cfg: with_vector(cfg, "graph", dense={**IMG, "index": "hnsw"}))
    c.upsert([3], ["c"], [None], base[2:], model=MODEL, named=[{**named[1], "graph": np.ones(3, np.float32)}])
    # Qdrant's indexed_vectors_count: the graph's 1 and the sparse vector's 1 (flat indexes and multivectors: scans)
    assert collection_info(c.info())["indexed_vectors_count"] == 2
    c.update_vectors(lambda cfg: without_vector(cfg, "graph"))
    again = Collection.open(tmp_path / "c")
    assert set(again.vectors.dense) == {"", "img", "multi"} and again.vectors.sparse["kw"].modifier == "idf"
    assert again.vectors.dense["multi"].multivector and again.vectors.bound.model == MODEL
    assert answers(again) == answers(c) and again.named.counts == {"img": 2, "multi": 1, "kw": 1}
    again.close()

    c.update_vectors(lambda cfg: without_vector(cfg, "img"))
    c.update_vectors(lambda cfg: without_vector(cfg, "kw"))
    assert set(c.vectors.dense) == {"", "multi"} and not c.vectors.sparse
    assert c.get(2, with_vector=True)["vectors"].keys() == {"multi"}
    c.update_vectors(lambda cfg: with_vector(cfg, "img", dense=IMG))  # again: empty, the old values are gone
    c.update_vectors(lambda cfg: with_vector(cfg, "kw", sparse={"modifier": "none"}))
    assert c.search(np.array([[1, 0.5, 0]], np.float32), 5, using="img") == [[]]
    assert c.search([sv([1], [1])], 5, using="kw") == [[]]
    again = Collection.open(tmp_path / "c")
    assert again.vectors.sparse["kw"].modifier == "none" and again.named.counts == {"img": 0, "multi": 1, "kw": 0}
    assert again.get(2, with_vector=True)["vectors"].keys() == {"multi"}
    assert again.get(2, with_vector=True)["vector"] == base[1].tolist()  # the model-bound vector untouched
    with pytest.raises(InvalidCollectionRequest, match="model-bound"):
        again.update_vectors(lambda cfg: without_vector(cfg, ""))
    again.close()
    c.close()


def test_a_write_of_a_vector_deleted_meanwhile_is_refused(tmp_path):
    c = Collection.create(tmp_path / "c", with_vector(bound_config(), "img", dense=IMG))
    c.update_vectors(lambda cfg: without_vector(cfg, "img"))
    with pytest.raises(InvalidCollectionRequest, match="no vector named 'img'") as e:  # checked before: deleted since
        c.upsert([1], ["a"], [None], np.eye(4, dtype=np.float32)[:1], model=MODEL,
                 named=[{"img": np.ones(3, np.float32)}])  # fmt: skip
    assert e.value.code == "vector_not_found" and c.count == 0
    c.close()


def test_the_milvus_backend_refuses_every_change():
    from service.collections.milvus import MilvusBackend

    backend = MilvusBackend(CollectionSettings(Settings()))
    backend.handles["c"] = SimpleNamespace(vectors=bound_config(), closed=False)

    async def run(change):
        await backend.update_vectors("c", change)

    try:
        asyncio.run(run(lambda cfg: without_vector(cfg, "absent")))  # changes nothing: passes
        with pytest.raises(InvalidCollectionRequest, match="one vector per collection") as e:
            asyncio.run(run(lambda cfg: with_vector(cfg, "img", dense=IMG)))
        assert e.value.code == "unsupported"
        with pytest.raises(InvalidCollectionRequest, match="model-bound"):
            asyncio.run(run(lambda cfg: without_vector(cfg, "")))
    finally:
        backend._pool.shutdown()
