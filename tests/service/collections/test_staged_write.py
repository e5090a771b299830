"""An upsert stages its vectors (checked, normalised) and its IVF list assignment before taking the write mutex
(:mod:`service.collections.embedded.staged_write`); under the mutex it uses that staging only if the collection's
vectors and indexes are still those it was made for, else stages again there: a named vector deleted in between
fails the write as it did before, and a write beside nothing uses its early staging."""

from __future__ import annotations

import numpy as np
import pytest

from service.collections.embedded import Collection, staged_write
from service.collections.embedded.staged_write import StagedWrite
from service.collections.errors import InvalidCollectionRequest
from service.collections.index import IndexSpec
from service.collections.schema import DenseVector, VectorsConfig
from service.collections.vector_names import with_vector, without_vector

MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}
IMG = {"size": 3, "metric": "cosine", "index": "flat"}


@pytest.fixture
def c(tmp_path):
    cfg = VectorsConfig({"": DenseVector("", IndexSpec("flat", "cosine", {}, 4), MODEL)})
    col = Collection.create(tmp_path / "c", cfg)
    col.update_vectors(lambda v: with_vector(v, "img", dense=IMG))
    yield col
    col.close()


@pytest.fixture
def stagings(monkeypatch) -> list[bool]:
    """The ``plan`` flag of every staging (the real one, recorded)."""
    calls: list[bool] = []
    real = StagedWrite.of

    def recorded(*args, plan=True):
        calls.append(plan)
        return real(*args, plan=plan)

    monkeypatch.setattr(staged_write.StagedWrite, "of", recorded)
    return calls


def test_a_staging_holds_while_the_collection_is_unchanged(c):
    vecs = np.eye(4, dtype=np.float32)[:2] * 3
    s = StagedWrite.of(c.vectors, c.bound, c.named, vecs, [{"img": np.array([0, 2, 0], np.float32)}, {}], np.arange(2))
    assert s.holds_for(c.vectors, c.bound, c.named, vecs)
    assert np.allclose(s.vecs, np.eye(4)[:2]) and np.allclose(s.extra[0]["img"], [0, 1, 0])  # normalised (cosine)
    assert not s.holds_for(c.vectors, c.bound, c.named, vecs.copy())  # another request's vectors
    c.update_vectors(lambda v: with_vector(v, "kw", sparse={"modifier": "idf"}))
    assert not s.holds_for(c.vectors, c.bound, c.named, vecs)  # the vectors changed meanwhile


def test_a_write_uses_its_early_staging(c, stagings):
    named = [{"img": np.array([1, 0, 0], np.float32)}, {"img": np.array([0, 1, 0], np.float32)}]
    c.upsert([1, 2], ["a", "b"], [None] * 2, np.eye(4, dtype=np.float32)[:2], model=MODEL, named=named)
    assert stagings == [True]  # staged once, before the mutex
    hits = c.search(np.array([[1, 0.1, 0]], np.float32), 2, using="img")[0]
    assert [h.id for h in hits] == [1, 2] and c.count == 2


def test_a_vector_deleted_after_staging_fails_the_write_under_the_mutex(c, monkeypatch, stagings):
    real = StagedWrite.of

    def then_delete(*args, plan=True):
        staged = real(*args, plan=plan)
        if plan:  # the early staging saw "img"; it is deleted before the write takes the mutex
            c.update_vectors(lambda v: without_vector(v, "img"))
        return staged

    monkeypatch.setattr(staged_write.StagedWrite, "of", then_delete)
    with pytest.raises(InvalidCollectionRequest, match="deleted meanwhile"):
        c.upsert([1], ["a"], [None], np.eye(4, dtype=np.float32)[:1], model=MODEL, named=[{"img": np.ones(3)}])
    assert c.count == 0
