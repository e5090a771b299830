"""A filtered FAISS search's allowed ids (``index.vector_index.allowed_selector``): a bitmap while it is small, FAISS's
hash set otherwise; both admit exactly the allowed ids, and a filtered search answers the same through either."""

from __future__ import annotations

import faiss
import numpy as np

from service.collections.index import IndexSpec, VectorIndex, normalize_params
from service.collections.index import vector_index as vi_module
from service.collections.index.vector_index import allowed_selector


def members(sel: faiss.IDSelector, top: int) -> np.ndarray:
    return np.array([i for i in range(top) if sel.is_member(i)], np.int64)


def test_both_selectors_admit_exactly_the_allowed_ids(monkeypatch):
    rng = np.random.default_rng(0)
    allowed = np.sort(rng.choice(5000, 300, replace=False)).astype(np.int64)
    sel, bitmap = allowed_selector(allowed[::-1].copy())  # any order
    assert isinstance(sel, faiss.IDSelectorBitmap) and bitmap is not None
    assert np.array_equal(members(sel, 6000), allowed)
    monkeypatch.setattr(vi_module, "BITMAP_MIN_IDS", 10)
    monkeypatch.setattr(vi_module, "BITMAP_IDS_PER_ALLOWED", 2)  # 5,000 ids > 2 x 300: the hash set
    sel, bitmap = allowed_selector(allowed)
    assert isinstance(sel, faiss.IDSelectorBatch) and bitmap is None
    assert np.array_equal(members(sel, 6000), allowed)
    for odd in (np.array([], np.int64), np.array([-1, 3], np.int64)):  # nothing allowed; a negative id
        assert isinstance(allowed_selector(odd)[0], faiss.IDSelectorBatch)


def test_a_filtered_ivf_search_answers_the_same_through_either(monkeypatch):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((4000, 16)).astype(np.float32)
    params = normalize_params("ivf_sq", {"nlist": 32, "nprobe": 32, "min_train_points": 32, "train_sample": 4000}, 16)
    vi = VectorIndex.build(IndexSpec("ivf_sq", "l2", params, 16), [(np.arange(4000, dtype=np.int64), X)], X)
    allowed = np.sort(rng.choice(4000, 200, replace=False)).astype(np.int64)
    Q = X[:5] + 0.01
    bitmap = vi.search(Q, 10, allowed, every=True)
    monkeypatch.setattr(vi_module, "BITMAP_MIN_IDS", 0)
    monkeypatch.setattr(vi_module, "BITMAP_IDS_PER_ALLOWED", 0)
    batch = vi.search(Q, 10, allowed, every=True)
    assert np.array_equal(bitmap[1], batch[1]) and np.isin(bitmap[1], allowed).all()
