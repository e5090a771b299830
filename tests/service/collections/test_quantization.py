"""Scalar quantization of an embedded collection's index (``flat_sq``, ``hnsw_sq``, ``ivf_sq``) on real embeddings: STS-B
sentences embedded with the default model, searched against exact search over the float32 originals. Rescoring
(Qdrant's default) keeps recall@10 >= 0.95; ``rescore: false`` answers the codes' approximate scores; ``ignore``
answers from the originals; ``oversampling`` sets how many candidates are rescored; a snapshot and a reopen keep the
trained codes. The Qdrant and native routes: tests/service/http/qdrant/test_qdrant_quantization.py."""

from __future__ import annotations

import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.index import IndexConfigError, IndexSpec, VectorIndex, normalize_params
from service.collections.query_model import QuantizationSearch
from service.collections.schema import VectorsConfig
from service.http.qdrant.collections import collection_info

N, NQ, K, D = 1000, 50, 10, 384
MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}


def sts_sentences(n: int) -> list[str]:
    """The first ``n`` distinct sentences of STS-B's train split (columns 5 and 6)."""
    import os

    path = os.path.join(os.environ.get("SHARED_DATA_DIR", "/work/shared/data"), "sts/STSBenchmark/sts-train.csv")
    seen: dict[str, None] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            for s in line.rstrip("\n").split("\t")[5:7]:
                seen.setdefault(s, None)
            if len(seen) >= n:
                break
    return list(seen)[:n]


@pytest.fixture(scope="module")
def sts(default_artifact):
    """``(corpus (N, 384), queries (NQ, 384))``: unit-normalised embeddings of distinct STS-B sentences."""
    from service.inference.onnx_encoder import OnnxModel

    model = OnnxModel(default_artifact, providers=["CPUExecutionProvider"], intra_op_threads=1)
    X = model.embed_sync(sts_sentences(N + NQ)).astype(np.float32)
    return X[:N], X[N:]


def exact_top(X: np.ndarray, Q: np.ndarray, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    S = Q @ X.T
    top = np.argsort(-S, axis=1, kind="stable")[:, :k]
    return top, np.take_along_axis(S, top, 1)


def recall(hits: list[list], truth: np.ndarray) -> float:
    return float(np.mean([len({h.id for h in row} & set(t.tolist())) / len(t) for row, t in zip(hits, truth)]))


#: an inverted file of 16 lists, 8 of them scanned a search
IVF = {"nlist": 16, "nprobe": 8}


@pytest.fixture(scope="module", params=["flat_sq", "hnsw_sq", "ivf_sq"])
def col(request, sts, tmp_path_factory):
    """A trained quantized collection of the STS-B corpus: ``{c, path, kind}`` (a test may reopen ``c``)."""
    kind, (X, _) = request.param, sts
    path = tmp_path_factory.mktemp(kind) / "c"
    params = {"min_train_points": 500, **(IVF if kind == "ivf_sq" else {})}
    spec = IndexSpec(kind, "cosine", normalize_params(kind, params, D), D)
    c = Collection.create(path, VectorsConfig.single(spec, MODEL))
    c.upsert(list(range(400)), [f"s{i}" for i in range(400)], [{} for _ in range(400)], X[:400])
    assert not c.index.quantized and c.info()["index"]["in_use"] == "flat (until trained)"
    c.upsert(list(range(400, N)), [f"s{i}" for i in range(400, N)], [{} for _ in range(400, N)], X[400:])
    if kind == "ivf_sq":  # k-means is maintenance, not a write's work
        assert not c.index.quantized and c.needs_maintenance() and c.info()["indexing"] == [""]
        assert collection_info(c.info())["status"] == "yellow"  # Qdrant: optimizations in progress
        assert collection_info(c.info())["indexed_vectors_count"] == 0  # the exact fallback: nothing indexed yet
        assert c.maintain() == "rebuilt the unnamed vector as ivf_sq (trained)"
    assert c.info()["indexing"] == [] and collection_info(c.info())["status"] == "green"
    assert collection_info(c.info())["indexed_vectors_count"] == (0 if kind == "flat_sq" else N)  # a full scan: none
    assert c.index.quantized and c.info()["index"]["in_use"] == kind  # the write past min_train_points trained it
    assert c.maintain() is None
    state = {"c": c, "path": path, "kind": kind}
    yield state
    state["c"].close()


def test_rescored_search_keeps_recall_and_answers_exact_scores(col, sts):
    X, Q = sts
    c = col["c"]
    assert c.index.quantized and c.info()["index"]["trained"]
    truth, _ = exact_top(X, Q)
    hits = c.search(Q, K)
    assert recall(hits, truth) >= 0.95
    for qi, row in enumerate(hits):  # rescored from the stored float32 originals
        assert np.allclose([h.score for h in row], X[[h.id for h in row]] @ Q[qi], atol=1e-5)


def test_rescore_false_answers_the_codes_approximate_scores(col, sts):
    X, Q = sts
    c = col["c"]
    hits = c.search(Q, K, quantization=QuantizationSearch(rescore=False))
    raw_scores, _ = c.index.search(c.bound.prepare(Q), K)  # the index's own scores, by internal id
    approx = np.array([[h.score for h in row] for row in hits])
    exact = np.array([X[[h.id for h in row]] @ Q[qi] for qi, row in enumerate(hits)])
    assert np.allclose(approx, raw_scores, atol=1e-6)
    assert np.abs(approx - exact).max() > 1e-4  # int8 codes: not the originals' scores
    assert recall(hits, exact_top(X, Q)[0]) >= 0.8


def test_ignore_answers_from_the_originals(col, sts):
    X, Q = sts
    c = col["c"]
    truth, scores = exact_top(X, Q)
    hits = c.search(Q, K, quantization=QuantizationSearch(ignore=True))
    assert [[h.id for h in row] for row in hits] == truth.tolist()
    assert np.allclose([[h.score for h in row] for row in hits], scores, atol=1e-5)


def test_oversampling_sets_the_candidates_rescored(col, sts, monkeypatch):
    X, Q = sts
    c, asked = col["c"], []
    search = VectorIndex.search
    monkeypatch.setattr(
        VectorIndex,
        "search",
        lambda self, q, k, allowed=None, ef=None, every=False: (
            asked.append(k) or search(self, q, k, allowed, ef, every)
        ),
    )
    truth = exact_top(X, Q)[0]
    default = c.search(Q, K)
    more = c.search(Q, K, quantization=QuantizationSearch(oversampling=3.0))
    c.search(Q, K, quantization=QuantizationSearch(oversampling=1.25))
    c.search(Q, K, quantization=QuantizationSearch(rescore=False, oversampling=3.0))
    c.search(Q, K, quantization=QuantizationSearch(ignore=True))  # the originals: no index search
    assert asked == [K, 3 * K, 13, K]
    assert recall(more, truth) >= recall(default, truth)


def test_a_selective_filter_scores_the_codes_and_reads_only_the_candidates(col, sts, monkeypatch):
    """A filter admitting few points (under ``exact_filter_threshold``) on an index of codes: every admitted point's
    code is scored and only the best ``oversampling * top_k`` are read from the store and re-scored (a graph's codes
    cannot all be scored: hnsw_sq reads every admitted vector), answering as the exact filtered search does."""
    from service.collections.embedded.store import Store
    from service.collections.filters import parse_filter

    X, Q = sts
    c, read = col["c"], []
    vectors_for = Store.vectors_for
    monkeypatch.setattr(
        Store, "vectors_for", lambda self, iids, d: read.append(len(iids)) or vectors_for(self, iids, d)
    )
    where = parse_filter({"$ids": list(range(0, N, 7))})  # 143 points
    admitted = np.arange(0, N, 7)
    truth = admitted[np.argsort(-(Q @ X[admitted].T), axis=1, kind="stable")[:, :K]]
    hits = c.search(Q, K, where=where)
    assert recall(hits, truth) >= 0.95 and all(h.id % 7 == 0 for row in hits for h in row)
    for qi, row in enumerate(hits):
        assert np.allclose([h.score for h in row], X[[h.id for h in row]] @ Q[qi], atol=1e-5)
    every = col["kind"] != "hnsw_sq"
    assert c.index.scores_every_code is every
    assert all(n <= (K * NQ if every else len(admitted)) for n in read) and (max(read) < len(admitted)) is every


def test_codes_in_ram_are_smaller_than_the_floats(col):
    c = col["c"]
    floats = N * D * 4
    assert c.index.memory_bytes() < floats * (0.4 if col["kind"] == "flat_sq" else 0.6)


def reopened(col: dict, Q: np.ndarray) -> tuple[dict, list, list]:
    """Snapshot, close and reopen the collection ``col["c"]`` (``col["path"]``): ``(its index info, its hits for
    ``Q`` before, after)``, scores rounded."""

    def hits(c: Collection) -> list:
        return [[(h.id, round(h.score, 5)) for h in row] for row in c.search(Q, K)]

    before = hits(col["c"])
    assert col["c"].snapshot() is not None
    col["c"].close()
    col["c"] = Collection.open(col["path"])
    return col["c"].info()["index"], before, hits(col["c"])


def test_snapshot_and_reopen_keep_the_trained_codes(col, sts):
    info, before, after = reopened(col, sts[1])
    assert (info["type"], info["in_use"], info["trained"]) == (col["kind"], col["kind"], True)
    assert info["params"]["quantization"] == {"type": "int8", "quantile": None, "always_ram": None}
    assert after == before


@pytest.mark.parametrize(
    "params",
    [
        {"quantization": {"type": "binary"}},
        {"quantization": {"type": "int8", "quantile": 0.3}},
        {"quantization": {"type": "int8", "bits": 4}},
        {"quantization": "int8"},
        {"min_train_points": 1},
        {"min_train_points": 100, "train_sample": 50},
        {"nlist": 4},
    ],
)
def test_bad_params_are_refused(params):
    for kind in ("flat_sq", "hnsw_sq"):
        with pytest.raises(IndexConfigError):
            normalize_params(kind, params, D)
    for bad in ({"m": 8}, {"nprobe": 0}, {"nlist": 8, "nprobe": 9}, {"nlist": 100, "min_train_points": 99}, params):
        if bad != {"nlist": 4}:
            with pytest.raises(IndexConfigError):
                normalize_params("ivf_sq", bad, D)


def test_ivf_sq_scans_nprobe_of_its_lists(sts):
    """``nprobe`` is the share of the inverted lists a search reads: one list of 16 misses neighbours that all 16
    find (then only the int8 codes stand between the search and exact search, and rescoring removes them)."""
    X, Q = sts
    truth = exact_top(X, Q)[0]
    got = {}
    for nprobe in (1, 16):
        spec = IndexSpec("ivf_sq", "cosine", normalize_params("ivf_sq", {"nlist": 16, "nprobe": nprobe}, D), D)
        vi = VectorIndex.build(spec, [(np.arange(N, dtype=np.int64), X)], train_sample=X)
        assert vi.quantized and vi.rescore_candidates(K) == K
        _, I = vi.search(Q, 2 * K)
        got[nprobe] = np.mean([len(set(r[:K]) & set(t)) / K for r, t in zip(I, truth)])
    assert got[1] < 0.8 < 0.9 < got[16], got


def test_quantile_trains_each_dimension_on_its_central_values():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4000, 16)).astype(np.float32)
    X[:8] *= 50  # outliers: the whole range spends most codes on them
    Q, ids = X[100:200] + 0.1 * rng.standard_normal((100, 16)).astype(np.float32), np.arange(4000, dtype=np.int64)
    truth = np.argsort(((Q[:, None, :] - X[None]) ** 2).sum(-1), axis=1)[:, :K]
    got = {}
    for quantile in (None, 0.99):
        params = normalize_params("flat_sq", {"quantization": {"quantile": quantile}}, 16)
        vi = VectorIndex.build(IndexSpec("flat_sq", "l2", params, 16), [(ids, X)], train_sample=X)
        got[quantile] = np.mean([len(set(r) & set(t)) / K for r, t in zip(vi.search(Q, K)[1], truth)])
    assert got[0.99] > got[None] + 0.1, got


@pytest.mark.parametrize("kind", ["flat_sq", "hnsw_sq"])
def test_a_client_supplied_vector_is_quantized_too(kind, tmp_path):
    """A named vector's index has no maintenance: the write that reaches ``min_train_points`` trains it in place, and
    a reopen (which rebuilds it from the store) trains it again."""
    from service.collections.schema import DenseVector

    rng = np.random.default_rng(1)
    X = rng.standard_normal((300, 16)).astype(np.float32)
    spec = IndexSpec(kind, "dot", normalize_params(kind, {"min_train_points": 250}, 16), 16)
    c = Collection.create(tmp_path / "c", VectorsConfig({"v": DenseVector("v", spec)}, {}))
    for s in range(0, 300, 100):
        c.upsert(list(range(s, s + 100)), ["t"] * 100, [{}] * 100, None, named=[{"v": x} for x in X[s : s + 100]])
        assert c.named.indexes["v"].quantized is (s + 100 >= 250)
    c.delete(ids=[0, 1])
    hits = c.search(X[5:6], K, using="v", quantization=QuantizationSearch(rescore=False))[0]
    assert {h.id for h in hits}.isdisjoint({0, 1}) and abs(hits[0].score - float(X[5] @ X[hits[0].id])) > 1e-6
    exact = c.search(X[5:6], K, using="v")[0]  # rescored: the originals' scores
    assert np.allclose([h.score for h in exact], [float(X[5] @ X[h.id]) for h in exact], atol=1e-5)
    c.close()
    c = Collection.open(tmp_path / "c")
    assert c.named.indexes["v"].quantized and c.named.indexes["v"].live == 298
    c.close()
