"""The inverted-file indexes' coarse quantizer (``index.coarse``): from 1,024 lists trained by two-level k-means
(spherical centroids for the inner-product metrics, as FAISS's own IVF training makes them), fewer lists by FAISS's
one k-means; the trained index finds the exact neighbours at a modest nprobe either way, on clustered data."""

from __future__ import annotations

import logging

import faiss
import numpy as np
import pytest

from service.collections.index import IndexSpec, VectorIndex, coarse, normalize_params, read_snapshot, write_snapshot

D = 16
N = 12_000


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    """``N`` points around 300 random centres (float32 ``(N, D)``) and 50 queries drawn the same way."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((300, D)) * 3
    pick = lambda n: (centres[rng.integers(0, 300, n)] + rng.standard_normal((n, D))).astype(np.float32)  # noqa: E731
    return pick(N), pick(50)


def trained(kind: str, metric: str, nlist: int, X: np.ndarray) -> VectorIndex:
    params = {"nlist": nlist, "nprobe": 64, "min_train_points": nlist, "train_sample": N}
    params |= {"m": 4, "rerank": 1} if kind == "ivf_pq" else {}
    spec = IndexSpec(kind, metric, normalize_params(kind, params, D), D)
    vi = VectorIndex.build(spec, [(np.arange(len(X), dtype=np.int64), X)], train_sample=X)
    assert vi.trained and vi.index.ntotal == len(X)
    return vi


def unit(X: np.ndarray) -> np.ndarray:
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def recall(vi: VectorIndex, X: np.ndarray, Q: np.ndarray, metric: str) -> float:
    S = -((Q[:, None, :] - X[None]) ** 2).sum(-1) if metric == "l2" else Q @ X.T
    truth = np.argsort(-S, axis=1)[:, :10]
    _, ids = vi.search(Q, 10)
    return float(np.mean([len(set(i) & set(t)) / 10 for i, t in zip(ids.tolist(), truth.tolist())]))


@pytest.fixture
def two_level_calls(monkeypatch) -> list[int]:
    """The ``nlist`` of every two-level k-means run (the real one, counted)."""
    calls: list[int] = []
    real = coarse.two_level_clustering

    def counted(x, nc1, nc2, **kw):
        calls.append(nc2)
        return real(x, nc1, nc2, **kw)

    monkeypatch.setattr(coarse, "two_level_clustering", counted)
    return calls


@pytest.mark.parametrize("kind", ["ivf_sq", "ivf_pq"])
def test_many_lists_are_trained_by_two_level_k_means(data, kind, two_level_calls):
    X, Q = data
    Xu, Qu = unit(X), unit(Q)
    vi = trained(kind, "cosine", 1024, Xu)
    norms = np.linalg.norm(vi.index.quantizer.reconstruct_n(0, 1024), axis=1)
    assert two_level_calls == [1024] and np.allclose(norms, 1, atol=1e-4)  # spherical centroids
    sizes = np.array([vi.index.invlists.list_size(i) for i in range(1024)])
    assert sizes.sum() == N and (sizes > 0).sum() > 900  # the lists are used, not a few huge ones
    assert recall(vi, Xu, Qu, "cosine") >= (0.9 if kind == "ivf_sq" else 0.6)
    l2 = trained(kind, "l2", 1024, X)
    assert two_level_calls == [1024, 1024] and recall(l2, X, Q, "l2") >= (0.9 if kind == "ivf_sq" else 0.6)
    assert not np.allclose(np.linalg.norm(l2.index.quantizer.reconstruct_n(0, 1024), axis=1), 1, atol=1e-2)


def test_few_lists_keep_faiss_k_means(data, two_level_calls):
    X, Q = data
    few = trained("ivf_sq", "cosine", 64, unit(X))
    assert two_level_calls == [] and recall(few, unit(X), unit(Q), "cosine") >= 0.95  # nprobe 64 of 64: every list


def test_a_failing_two_level_k_means_falls_back_to_one_k_means(data, monkeypatch, caplog):
    X, Q = data

    def fails(*args, **kwargs):
        raise RuntimeError("Number of training points should be at least as large as number of clusters")

    monkeypatch.setattr(coarse, "two_level_clustering", fails)
    with caplog.at_level(logging.WARNING, logger="service.collections"):
        vi = trained("ivf_sq", "cosine", 1024, unit(X))
    assert "one k-means instead" in caplog.text
    assert vi.index.quantizer.ntotal == 1024 and recall(vi, unit(X), unit(Q), "cosine") >= 0.9


def list_of(index) -> np.ndarray:
    """The list each id is stored in (ids are ``0..n-1`` here), int64."""
    out = np.full(index.ntotal, -1, np.int64)
    for i in range(index.nlist):
        n = index.invlists.list_size(i)
        if n:
            out[faiss.rev_swig_ptr(index.invlists.get_ids(i), n).copy()] = i
    return out


def test_writes_find_their_list_in_a_graph_over_the_centroids(data, tmp_path):
    """From 1,024 lists each added vector's list comes from the HNSW graph over the centroids: nearly always its
    nearest (the rest near ones, which a search probes too), so recall holds; the graph is built once per index
    object, and again for an index loaded from a snapshot; removal is FAISS's as before."""
    X, Q = data
    Xu, Qu = unit(X), unit(Q)
    vi = trained("ivf_sq", "cosine", 1024, Xu)
    assert vi.index in coarse._graphs  # the adds built it
    graph = coarse.assignment_graph(vi.index)
    assert coarse.assignment_graph(vi.index) is graph and graph.ntotal == 1024
    nearest = vi.index.quantizer.assign(Xu, 1).ravel()
    stored = list_of(vi.index)
    assert (stored >= 0).all() and float(np.mean(stored == nearest)) >= 0.9
    assert recall(vi, Xu, Qu, "cosine") >= 0.9
    write_snapshot(vi, tmp_path / "snap", 1)
    loaded, _ = read_snapshot(tmp_path / "snap", vi.spec)
    more = unit(np.random.default_rng(1).standard_normal((500, D)).astype(np.float32))
    loaded.add(np.arange(N, N + 500, dtype=np.int64), more)  # a new graph for the loaded index
    assert coarse.assignment_graph(loaded.index) is not graph and loaded.index.ntotal == N + 500
    loaded.remove(np.arange(0, N, 2, dtype=np.int64))
    assert loaded.index.ntotal == N // 2 + 500
    few = trained("ivf_sq", "cosine", 64, Xu)  # fewer lists: FAISS's exact assignment, no graph
    assert few.index not in coarse._graphs
    assert np.array_equal(list_of(few.index), few.index.quantizer.assign(Xu, 1).ravel())


def test_a_write_planned_ahead_uses_its_lists_only_in_the_index_it_was_planned_for(data):
    """A write finds its IVF lists before taking the collection's write mutex (``plan_add``: the graph's lists, made
    without changing the index); ``add`` then stores each vector in the planned list, unless the plan was made for
    another index object (one trained or loaded meanwhile), whose lists it finds again. Fewer lists or the untrained
    fallback plan nothing."""
    X, _ = data
    Xu = unit(X)
    vi, other = trained("ivf_sq", "cosine", 1024, Xu[:-500]), trained("ivf_sq", "cosine", 1024, Xu[:-500])
    more = Xu[-500:]
    plan = vi.plan_add(more)
    graph_lists = coarse.assignment_graph(vi.index).search(more, 1)[1].ravel()
    assert isinstance(plan, coarse.Assignment) and plan.index is vi.index
    assert np.array_equal(plan.lists, graph_lists) and vi.index.ntotal == N - 500  # planning added nothing
    vi.add(np.arange(N - 500, N, dtype=np.int64), more, coarse.Assignment(vi.index, np.full(500, 7)))
    assert (list_of(vi.index)[N - 500 :] == 7).all()  # the planned lists, as given
    other.add(np.arange(N - 500, N, dtype=np.int64), more, coarse.Assignment(vi.index, np.full(500, 7)))
    assert np.array_equal(
        list_of(other.index)[N - 500 :], coarse.assignment_graph(other.index).search(more, 1)[1].ravel()
    )
    assert trained("ivf_sq", "cosine", 64, Xu).plan_add(more) is None
    spec = IndexSpec("ivf_sq", "cosine", normalize_params("ivf_sq", {"nlist": 1024}, D), D)
    assert VectorIndex(spec).plan_add(more) is None  # the exact fallback until trained


def test_a_filter_probes_more_lists_the_fewer_it_admits():
    assert coarse.filtered_nprobe(512, 16384, 1.0) == 512
    assert coarse.filtered_nprobe(512, 16384, 0.1) == 1022  # 512 * 0.1 ** -0.3
    assert coarse.filtered_nprobe(512, 16384, 0.01) == 2039
    assert coarse.filtered_nprobe(512, 16384, 1e-6) == 16384  # at most every list
    assert coarse.filtered_nprobe(512, 256, 1.0) == 256


def _recall(got: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(g) & set(t)) / truth.shape[1] for g, t in zip(got, truth)]))


def test_a_filtered_search_keeps_its_recall_by_probing_wider(data, tmp_path):
    X, Q = data
    X, Q = unit(X), unit(Q)
    vi = trained("ivf_sq", "cosine", 1024, X)
    vi.spec.params["nprobe"] = 64
    allowed = np.arange(0, N, 100, dtype=np.int64)  # 1 %
    truth = np.argsort(-(Q @ X[allowed].T), axis=1)[:, :10]
    truth = allowed[truth]
    widened = _recall(vi.search(Q, 10, allowed)[1], truth)
    plain = faiss.SearchParametersIVF()
    plain.nprobe, plain.sel = 64, faiss.IDSelectorBatch(allowed)
    narrow = _recall(vi.index.search(Q, 10, params=plain)[1], truth)
    assert widened >= 0.95 and widened > narrow + 0.2, (widened, narrow)
    # one query's lists split over two threads (parallel_mode 1, kept by a snapshot) answer as one thread does
    write_snapshot(vi, tmp_path / "s", 1)
    loaded, _ = read_snapshot(tmp_path / "s", vi.spec)
    assert vi.index.parallel_mode == loaded.index.parallel_mode == coarse.PARALLEL_MODE
    one = loaded.search(Q[:1], 10, allowed)[1]
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        assert np.array_equal(loaded.search(Q[:1], 10, allowed)[1], one)
    finally:
        faiss.omp_set_num_threads(before)
