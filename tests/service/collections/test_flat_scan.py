"""A flat index's searches answered by a NumPy scan of the vectors FAISS holds: FAISS's answer exactly (its
per-vector kernel's scores bit for bit, its ids and its order of ties), whatever the batch or FAISS's threads, with
no copy of the vectors; over an allowed set, removed ids and an HNSW graph's tombstones too."""

from __future__ import annotations

import tracemalloc

import faiss
import numpy as np
import pytest

import service.collections.index.vector_index as vector_index
from service.collections.index import IndexSpec, VectorIndex

D = 24


@pytest.fixture(params=["blas", "rows"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every search through the BLAS scan (candidates re-scored by FAISS's kernel), or the small data's default:
    rows scored one by one by FAISS's kernel (and FAISS itself for unrestricted searches)."""
    if request.param == "blas":
        monkeypatch.setattr(vector_index, "SCAN_MIN_FLOATS", 0)
    return request.param


def data(n: int, metric: str, seed: int, ties: bool = False, d: int = D) -> np.ndarray:
    """``n`` random ``d``-d rows (unit rows for cosine); with ``ties``, copies of 7 rows only (equal scores)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((7 if ties else n, d)).astype(np.float32)
    if ties:
        x = x[rng.integers(0, 7, n)]
    return x / np.linalg.norm(x, axis=1, keepdims=True) if metric == "cosine" else x * 3


def index(metric: str, x: np.ndarray, kind: str = "flat", params: dict | None = None) -> VectorIndex:
    """A VectorIndex over ``x`` under increasing, gapped ids (3i + 5)."""
    vi = VectorIndex(IndexSpec(kind, metric, params or {}, x.shape[1]))
    for a in range(0, len(x), 1000):
        vi.add(np.arange(a, min(a + 1000, len(x)), dtype=np.int64) * 3 + 5, x[a : a + 1000])
    return vi


def faiss_answer(vi: VectorIndex, q: np.ndarray, k: int, allowed: np.ndarray | None = None):
    """FAISS's own search of the index (one OpenMP thread: its per-vector kernel), in the service's units."""
    params = faiss.SearchParameters()
    sel = faiss.IDSelectorBatch(allowed) if allowed is not None else None
    if sel is not None:
        params.sel = sel
    faiss.omp_set_num_threads(1)
    D_, I_ = vi.index.search(q, k, params=params)
    return (np.sqrt(np.maximum(D_, 0)) if vi.spec.metric == "l2" else D_), I_


def assert_same(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    """Same ids in the same order and bit-equal scores, over the columns ``got`` has."""
    w = got[1].shape[1]
    np.testing.assert_array_equal(got[1], want[1][:, :w])
    np.testing.assert_array_equal(got[0], want[0][:, :w])


@pytest.mark.parametrize("metric", ["cosine", "dot", "l2"])
@pytest.mark.parametrize("ties", [False, True])
def test_search_and_exact_search_answer_as_faiss(metric: str, ties: bool, path: str) -> None:
    x = data(3000, metric, 1, ties)
    vi = index(metric, x)
    vi.remove(np.arange(0, 3000, 7, dtype=np.int64) * 3 + 5)  # FAISS compacts the rest: positions move
    q = data(5, metric, 2) if not ties else x[:5] + 0.01
    rng = np.random.default_rng(3)
    ids = np.arange(3000, dtype=np.int64) * 3 + 5
    for k in (1, 10, 60):
        want = faiss_answer(vi, q, k)
        assert_same(vi.search(q, k), want)
        assert_same(vi.search(q[:1], k), (want[0][:1], want[1][:1]))
        assert_same(vi.exact_search(q, k), want)
        for frac in (0.01, 0.6):  # scored row by row in place; the scan with the others masked
            allowed = np.sort(rng.choice(ids, int(3000 * frac), replace=False))
            allowed = np.concatenate([allowed, [10**9]])  # an id the index does not hold
            want = faiss_answer(vi, q, k, allowed)
            assert_same(vi.search(q, k, allowed), want)
            got = vi.exact_search(q, k, allowed)
            assert got[1].shape[1] == min(k, int((want[1][0] >= 0).sum()))
            assert_same(got, want)


def test_a_query_scores_the_same_alone_or_in_a_batch_and_whatever_faiss_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FAISS 1.15 answers one query with two OpenMP threads by a matrix product over halves of the vectors, a small
    batch one vector at a time, a batch of 128,000 query floats or more by a matrix product again: scores that
    differ in the last bits. The scan answers every batch the same way."""
    monkeypatch.setattr(vector_index, "SCAN_MIN_FLOATS", 0)  # as over a large index
    d = 256
    x = data(12_000, "dot", 4, d=d)
    vi = index("dot", x)
    q = data(520, "dot", 5, d=d)  # 133,120 query floats
    picked = [0, 1, 2, 519]
    faiss.omp_set_num_threads(2)
    try:
        large = vi.search(q, 10)
        small = vi.search(q[picked], 10)
        alone = [vi.search(q[i : i + 1], 10) for i in picked]
    finally:
        faiss.omp_set_num_threads(1)
    for j, i in enumerate(picked):
        for batch, row in ((large, i), (small, j)):
            np.testing.assert_array_equal(alone[j][1][0], batch[1][row])
            np.testing.assert_array_equal(alone[j][0][0], batch[0][row])


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_the_scan_allocates_no_copy_of_the_vectors(metric: str, path: str) -> None:
    n, d = 40_000, 96
    vi = index(metric, data(n, metric, 6, d=d))
    q = data(2, metric, 7, d=d)
    vi.search(q, 10)  # the cached norms, once (4 bytes a row)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        vi.exact_search(q, 10)
        vi.search(q, 10)
        vi.exact_search(q, 10, np.arange(0, n, 2, dtype=np.int64) * 3 + 5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < n * d * 4 / 4, peak  # the vectors are n * d * 4 bytes


def test_exact_search_over_an_hnsw_graph_leaves_tombstones_out(path: str) -> None:
    x = data(2000, "l2", 8)
    vi = index("l2", x, "hnsw", {"M": 8, "ef_construction": 16, "ef_search": 16})
    gone = np.arange(0, 2000, 3, dtype=np.int64) * 3 + 5
    vi.remove(gone)
    assert vi.n_tombstones == len(gone)
    live = np.setdiff1d(np.arange(2000, dtype=np.int64) * 3 + 5, gone)
    ref = VectorIndex(IndexSpec("flat", "l2", {}, D))
    ref.index.add_with_ids(x[(live - 5) // 3], live)  # FAISS's flat index over the live rows, in the same order
    q = data(3, "l2", 9)
    assert_same(vi.exact_search(q, 20), faiss_answer(ref, q, 20))
    allowed = live[::5]
    assert_same(vi.exact_search(q, 20, np.concatenate([allowed, gone[:50]])), faiss_answer(ref, q, 20, allowed))


def test_an_empty_index_finds_nothing(path: str) -> None:
    vi = index("l2", data(10, "l2", 10))
    vi.remove(np.arange(10, dtype=np.int64) * 3 + 5)
    q = data(2, "l2", 11)
    s, i = vi.exact_search(q, 5)
    assert s.shape == i.shape == (2, 0)
    s, i = vi.exact_search(q, 5, np.array([5, 8], np.int64))
    assert s.shape == i.shape == (2, 0)
    assert (vi.search(q, 5)[1] == -1).all()
