"""The ``ivf_pq_fs`` index (FAISS ``IndexIVFPQFastScan``: 4-bit product-quantization codes in blocks of 32, scored
by SIMD table lookups) in an embedded collection of STS-B sentences embedded with the default model, against exact
search over the float32 originals: trained by maintenance, its ``rerank * top_k`` candidates re-scored exactly
(recall@10 >= 0.95), deletions in place, filters through its selector, snapshots; and the write path that lets FAISS
pack the blocks while the centroids' graph finds the lists (from 1,024 lists)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.filters import parse_filter
from service.collections.index import IndexConfigError, IndexSpec, VectorIndex, coarse, normalize_params
from service.collections.query_model import QuantizationSearch
from service.collections.schema import VectorsConfig
from tests.service.collections.test_quantization import MODEL, D, K, N, exact_top, recall, reopened, sts  # noqa: F401

PARAMS = {"nlist": 16, "nprobe": 8, "min_train_points": 500}


@pytest.fixture(scope="module")
def col(sts, tmp_path_factory):  # noqa: F811
    """A trained ``ivf_pq_fs`` collection of the STS-B corpus: ``{c, path}`` (a test may reopen ``c``)."""
    X, _ = sts
    path = tmp_path_factory.mktemp("ivf_pq_fs") / "c"
    spec = IndexSpec("ivf_pq_fs", "cosine", normalize_params("ivf_pq_fs", PARAMS, D), D)
    c = Collection.create(path, VectorsConfig.single(spec, MODEL))
    c.upsert(list(range(N)), [f"s{i}" for i in range(N)], [{} for _ in range(N)], X)
    assert not c.index.quantized and c.needs_maintenance()  # k-means is maintenance, not a write's work
    assert c.maintain() == "rebuilt the unnamed vector as ivf_pq_fs (trained)"
    assert c.index.quantized and c.info()["index"]["in_use"] == "ivf_pq_fs"
    state = {"c": c, "path": path}
    yield state
    state["c"].close()


def test_params_default_to_half_the_dimension_and_twenty_candidates_a_result():
    p = normalize_params("ivf_pq_fs", {}, D)
    assert (p["m"], p["rerank"], p["nlist"], p["nprobe"], p["min_train_points"]) == (192, 20, 1024, 16, 39 * 1024)
    assert normalize_params("ivf_pq_fs", {}, 100)["m"] == 50
    bad_params = ({"m": 7}, {"m": 10}, {"rerank": 0}, {"nbits": 4}, {"by_residual": 1}, {"min_train_points": 1})
    for bad in bad_params:
        with pytest.raises(IndexConfigError):
            normalize_params("ivf_pq_fs", bad, D)


def test_rescored_candidates_keep_recall_and_answer_exact_scores(col, sts, monkeypatch):  # noqa: F811
    X, Q = sts
    c, asked = col["c"], []
    search = VectorIndex.search
    monkeypatch.setattr(
        VectorIndex, "search", lambda self, q, k, *a, **kw: asked.append(k) or search(self, q, k, *a, **kw)
    )
    hits = c.search(Q, K)
    assert asked == [20 * K]  # rerank 20: 200 candidates re-scored from the stored floats
    assert recall(hits, exact_top(X, Q)[0]) >= 0.95
    for qi, row in enumerate(hits):
        assert np.allclose([h.score for h in row], X[[h.id for h in row]] @ Q[qi], atol=1e-5)
    raw = c.search(Q, K, quantization=QuantizationSearch(rescore=False))
    approx = np.array([[h.score for h in row] for row in raw])
    exact = np.array([X[[h.id for h in row]] @ Q[qi] for qi, row in enumerate(raw)])
    assert np.abs(approx - exact).max() > 1e-3  # 4-bit codes: far from the originals' scores


def test_codes_take_a_fraction_of_the_floats(col):
    assert col["c"].index.memory_bytes() < N * D * 4 * 0.15  # 96 code bytes + an 8-byte id against 1,536


def test_filters_and_deletes_reach_the_index(col, sts):  # noqa: F811
    X, Q = sts
    c = col["c"]
    admitted = np.arange(0, N, 7)  # under exact_filter_threshold: every admitted code scored, the best re-scored
    truth = admitted[np.argsort(-(Q @ X[admitted].T), axis=1, kind="stable")[:, :K]]
    hits = c.search(Q, K, where=parse_filter({"$ids": admitted.tolist()}))
    assert all(h.id % 7 == 0 for row in hits for h in row) and recall(hits, truth) >= 0.95
    gone = [row[0].id for row in c.search(Q[:5], 1)]
    before = c.index.ntotal
    c.delete(gone)
    assert c.index.ntotal == before - len(set(gone)) and c.index.n_tombstones == 0  # removed in place
    assert not {h.id for row in c.search(Q[:5], K) for h in row} & set(gone)


def test_snapshot_and_reopen_keep_the_trained_codes(col, sts):  # noqa: F811
    info, before, after = reopened(col, sts[1])
    assert (info["type"], info["in_use"], info["trained"], info["params"]["m"]) == ("ivf_pq_fs", "ivf_pq_fs", True, 192)
    assert after == before


def test_writes_through_the_graph_pack_the_same_codes_as_faiss_own_add():
    """From 1,024 lists a write's lists come from the centroids' HNSW graph while FAISS packs the blocks: scored over
    every list, the index answers exactly as one filled by FAISS's exact ``add_with_ids`` (a vector's 4-bit code does
    not depend on its list when codes are not residuals), and the flat quantizer is back for searches."""
    rng = np.random.default_rng(0)
    d, n = 16, 12_000
    X = rng.standard_normal((n, d)).astype(np.float32)
    params = normalize_params(
        "ivf_pq_fs", {"nlist": 1024, "nprobe": 1024, "m": 8, "min_train_points": 1024, "by_residual": False}, d
    )
    spec = IndexSpec("ivf_pq_fs", "l2", params, d)
    kind = VectorIndex(spec).type
    ids = np.arange(n, dtype=np.int64) * 3
    graph = kind.create_trained(spec, X)
    exact = faiss.clone_index(graph)
    kind.add(spec, graph, X, ids)
    exact.add_with_ids(X, ids)
    assert isinstance(faiss.downcast_index(graph.quantizer), faiss.IndexFlat) and coarse.assignment_graph(graph)
    moved = sum(graph.invlists.list_size(i) != exact.invlists.list_size(i) for i in range(1024))
    assert 0 < moved < 1024  # the graph put a few vectors in a near list
    D1, I1 = graph.search(X[:50], 10)
    D2, I2 = exact.search(X[:50], 10)
    assert (I1 == I2).mean() > 0.99 and np.allclose(D1, D2, atol=1e-4)
