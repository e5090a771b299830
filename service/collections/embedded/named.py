"""The named vectors of an embedded collection other than its model-bound one: one FAISS
:class:`~..index.VectorIndex` per client-supplied dense vector (derived data, like the model-bound vector's index:
loaded at open from its snapshot plus the later writes, :mod:`.dense_snapshots`, or built from SQLite) and the
in-memory inverted index of each sparse vector (:mod:`.sparse_index`, built from its durable rows in
:mod:`.store.named`).

The owning :class:`~.collection.Collection` serialises writes and holds its readers-writer lock around everything
here, exactly as for its model-bound index.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from service.collections.embedded import dense_snapshots, sparse_snapshots
from service.collections.embedded.sparse_index import SparseIndex, pack
from service.collections.embedded.store import Store
from service.collections.embedded.store import named as tables
from service.collections.errors import InvalidCollectionRequest
from service.collections.index import VectorIndex
from service.collections.metric import is_distance, max_sim_score, normalised
from service.collections.multivector_scoring import max_sim_totals
from service.collections.schema import SparseVec, VectorsConfig
from service.collections.scorers import Scorer


def prepared(v: np.ndarray, metric: str) -> np.ndarray:
    """Vectors ``(n, d)`` as indexed and searched: float32, :func:`..metric.normalised` (a multi-example query,
    :class:`~..scorers.Scorer`, holds its examples prepared: returned as it is)."""
    if isinstance(v, Scorer):
        return v
    return normalised(np.ascontiguousarray(v, dtype=np.float32), metric)


class NamedIndexes:
    """The client-supplied dense vectors' FAISS indexes and the sparse vectors' inverted indexes of one collection.

    Args:
        store: the collection's store.
        config: the collection's vectors.
    """

    def __init__(self, store: Store, config: VectorsConfig) -> None:
        self.store, self.config = store, config
        self.dense = {v.name: v for v in config.client_dense()}
        #: the (dense, sparse) vector names held in the store's named tables (what a replace or delete removes)
        self.fields: tuple[list[str], list[str]] = (list(self.dense), list(config.sparse))
        self.indexes: dict[str, VectorIndex] = {}
        self.sparse: dict[str, SparseIndex] = {n: SparseIndex() for n in config.sparse}
        self.counts: dict[str, int] = dict.fromkeys([*self.dense, *config.sparse], 0)  # points holding each vector
        #: per sparse vector and per indexed dense one, the sequence number its newest snapshot covers (0: none;
        #: :mod:`.sparse_snapshots`, :mod:`.dense_snapshots`)
        self.snapshot_seqs: dict[str, int] = dict.fromkeys([*config.sparse, *self._indexed()], 0)

    def _indexed(self) -> list[str]:
        """The dense vectors with a FAISS index (a multivector has none: scanned)."""
        return [n for n, v in self.dense.items() if not v.multivector]

    def load(self) -> float:
        """Load every dense and sparse index from its snapshot plus the later writes, or build it from SQLite
        (:func:`.dense_snapshots.load`, :func:`.sparse_snapshots.load`), count each vector's points; returns the
        seconds it took."""
        t0 = time.monotonic()
        conn = self.store.reader()
        for name, v in self.dense.items():
            self.counts[name] = tables.count(conn, name, sparse=False)
            if not v.multivector:  # a multivector has no index: scanned (multi_search)
                got = dense_snapshots.load(self.store.path, self.store, conn, name, v.spec, self.counts[name])
                if got is None:
                    got = VectorIndex.build(v.spec, tables.iter_dense(conn, name, v.spec.dimension)), 0
                self.indexes[name], self.snapshot_seqs[name] = got
        for name in self.config.sparse:
            got = sparse_snapshots.load(self.store.path, self.store, conn, name)
            if got is None:
                got = SparseIndex.build(tables.iter_sparse(conn, name)), 0
            self.sparse[name], self.snapshot_seqs[name] = got
            self.counts[name] = self.sparse[name].live
        return time.monotonic() - t0

    @property
    def snapshot_seq(self) -> int | None:
        """The oldest of the sparse and indexed dense vectors' snapshots' sequence numbers (None without one)."""
        return min(self.snapshot_seqs.values(), default=None)

    def snapshot(self, seq: int) -> None:
        """Write a snapshot of every sparse and dense index covering the writes up to ``seq``
        (:func:`.sparse_snapshots.save`, :func:`.dense_snapshots.save`; the caller holds the write mutex, and prunes
        the ``removed`` table only once this returned). A dense index whose config is not its vector's (rebuilt
        beside, for a new config) gets none, and its older ones are forgotten: the pruning would outrun them."""
        for name, index in self.sparse.items():
            sparse_snapshots.save(index, self.store.path, name, seq)
            self.snapshot_seqs[name] = seq
        last = int(self.store.meta()["next_iid"]) - 1
        for name, index in self.indexes.items():
            if index.spec == self.dense[name].spec:
                dense_snapshots.save(index, self.store.path, name, seq, last)
            else:
                dense_snapshots.forget(self.store.path, name)
            self.snapshot_seqs[name] = seq

    def reconfigure(self, config: VectorsConfig) -> NamedIndexes:
        """Make ``config`` the collection's vectors in the store, in one SQLite transaction
        (:func:`.store.named.reconfigure`): the stored values of every vector added or dropped are removed with it.
        Returns the indexes for ``config`` (:meth:`reconfigured`), to be swapped in."""
        names = lambda cfg: {(n, "dense") for n in cfg.dense} | {(n, "sparse") for n in cfg.sparse}  # noqa: E731
        cleared = sorted({n for n, _ in names(self.config) ^ names(config)})
        changed = [n for n, v in config.dense.items() if n in self.dense and self.dense[n].spec != v.spec]
        for n in cleared:  # before the values go: a crash in between must not find a snapshot of them
            sparse_snapshots.forget(self.store.path, n)
        for n in {*cleared, *changed}:  # nor a snapshot of another config than the one recorded
            dense_snapshots.forget(self.store.path, n)
        tables.reconfigure(self.store.db_path, config.to_json(), cleared)
        return self.reconfigured(config)

    def reconfigured(self, config: VectorsConfig) -> NamedIndexes:
        """These indexes for the collection's new vectors ``config`` (a vector added or dropped): a vector kept keeps
        its index and count, one added starts empty (no point holds it yet), one dropped is forgotten."""
        out = NamedIndexes(self.store, config)
        for name, v in out.dense.items():
            if name in self.indexes:
                out.indexes[name] = self.indexes[name]
            elif name not in self.dense and not v.multivector:
                out.indexes[name] = VectorIndex(v.spec)
        out.sparse = {n: self.sparse.get(n, out.sparse[n]) for n in config.sparse}
        out.snapshot_seqs = {n: self.snapshot_seqs.get(n, 0) for n in [*config.sparse, *out._indexed()]}
        out.counts = {n: self.counts.get(n, 0) for n in [*out.dense, *config.sparse]}
        return out

    def rebuilt(self, name: str) -> VectorIndex:
        """A new index of the dense vector ``name`` with its configured spec, built from its stored values (the
        config changed; to be swapped into :attr:`indexes` by the caller)."""
        v = self.dense[name]
        return VectorIndex.build(v.spec, tables.iter_dense(self.store.reader(), name, v.spec.dimension))

    def prepare(self, named: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The points' named vectors as stored: dense ones unit-normalised for cosine (float32), sparse as given.

        Raises:
            InvalidCollectionRequest: a vector the collection no longer has as that kind (``vector_not_found``: it
                was deleted after the write was checked).
        """
        out = []
        for vecs in named:
            row = {}
            for name, v in vecs.items():
                if name not in (self.config.sparse if isinstance(v, SparseVec) else self.dense):
                    raise InvalidCollectionRequest(
                        f"the collection has no vector named {name!r} (deleted meanwhile)",
                        "vectors",
                        "vector_not_found",
                    )
                row[name] = (
                    v
                    if isinstance(v, SparseVec)
                    else prepared(v.reshape(-1, v.shape[-1]), self.dense[name].spec.metric).reshape(v.shape)
                )
            out.append(row)
        return out

    def removed(self, iids: np.ndarray, had: dict[str, int]) -> None:
        """Drop the points ``iids`` (replaced or deleted) from the indexes; ``had``: how many of them held each
        vector (what the store's write removed, with the sparse vectors' terms: :class:`.store.named.Removed`)."""
        for index in self.indexes.values():
            index.remove(iids, may_be_absent=True)
        terms = getattr(had, "terms", {})
        for name, sparse in self.sparse.items():
            sparse.remove(iids, terms.get(name))
        for name, n in had.items():
            self.counts[name] -= n

    def plans(self, named: list[dict[str, Any]]) -> dict[str, object]:
        """Per indexed dense vector, its index's :meth:`~..index.VectorIndex.plan_add` for the prepared ``named``
        vectors (those holding it, in order) where there is one: what :meth:`added` can take, made ahead."""
        out = {}
        for name, index in self.indexes.items():
            rows = [v[name] for v in named if name in v]
            if rows and (plan := index.plan_add(np.stack(rows))) is not None:
                out[name] = plan
        return out

    def added(self, iids: np.ndarray, named: list[dict[str, Any]], plans: dict[str, object] | None = None) -> None:
        """Index the prepared named vectors of the points just stored as ``iids`` (``plans``: :meth:`plans`' for
        them)."""
        for name, index in self.indexes.items():
            rows = [(int(i), v[name]) for i, v in zip(iids, named) if name in v]
            if rows:
                vecs = np.stack([r[1] for r in rows])
                index.add(np.array([r[0] for r in rows], np.int64), vecs, (plans or {}).get(name))
        for name, sparse in self.sparse.items():
            rows = [(int(i), v[name]) for i, v in zip(iids, named) if name in v]
            if rows:
                sparse.add(np.array([r[0] for r in rows], np.int64), pack([r[1] for r in rows]))
        for vecs in named:
            for name in vecs:
                self.counts[name] += 1

    def fetch_dense(self, name: str, iids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(iids, vectors)`` of the points among ``iids`` holding the dense vector ``name``."""
        return tables.dense_for(self.store.reader(), name, iids, self.dense[name].spec.dimension)

    def scan_dense(self, name: str) -> Any:
        """``(iids, vectors)`` chunks of every stored dense vector ``name`` (an exact search's scan)."""
        return tables.iter_dense(self.store.reader(), name, self.dense[name].spec.dimension)

    def sparse_search(
        self, name: str, queries: list[SparseVec], top_k: int, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``top_k`` best points of each sparse query (exact dot product, IDF-weighted when the vector's modifier
        is ``idf``), among ``allowed`` (int64 internal ids; None: all); points sharing no term with the query are
        never returned.

        Returns:
            ``(scores, iids)``, each ``(nq, top_k)`` (NaN / -1 past the last hit).
        """
        if name in self.dense:
            return self._multi(name, queries, top_k, allowed)
        modifier = self.config.sparse[name].modifier
        if isinstance(queries, Scorer):
            return self._scored(name, queries, top_k, allowed, modifier)
        D = np.full((len(queries), top_k), np.nan, np.float32)
        I = np.full((len(queries), top_k), -1, np.int64)
        index = self.sparse[name]
        for qi, q in enumerate(queries):
            scores, ids = index.search(q, modifier, top_k, allowed)  # best first; ties by internal id
            D[qi, : len(ids)], I[qi, : len(ids)] = scores, ids
        return D, I

    def scanned(self, name: str) -> bool:
        """Whether the vector ``name`` is searched by :meth:`sparse_search` (a sparse vector or a multivector: no
        FAISS index)."""
        return name in self.config.sparse or (name in self.dense and self.dense[name].multivector)

    def metric(self, name: str) -> str:
        """The metric hits of a :meth:`scanned` vector are scored in (``dot`` for sparse vectors)."""
        return self.dense[name].spec.metric if name in self.dense else "dot"

    def _multi(self, name: str, queries: Any, top_k: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The ``top_k`` best points of each multivector query (``(m_q, d)``) by MAX_SIM over every stored matrix of
        the vector ``name`` (among ``allowed``): the sum over the query's rows of their best similarity to the point's
        rows (dot, on unit rows for cosine; minus the squared distance for l2, reported as the square root of its
        magnitude, as Qdrant reports it). Returns ``(scores, iids)``, each ``(nq, top_k)`` (NaN / -1 past the last).
        A multi-example query (:class:`~..scorers.Scorer` of matrices) scores every point holding the vector by
        MAX_SIM to its examples: ``(1, <=top_k)``."""
        metric, d = self.dense[name].spec.metric, self.dense[name].spec.dimension
        if isinstance(queries, Scorer):  # its examples are matrices (..multivector_scoring), each scored by MAX_SIM
            keep_ = None if allowed is None else set(allowed.tolist())
            rows = [(i, b) for i, b in tables.iter_blobs(self.store.reader(), name) if keep_ is None or i in keep_]
            ids = np.array([i for i, _ in rows], np.int64)
            if not len(ids):  # nothing to score (score_with takes one candidate or more)
                return np.zeros((1, 0), np.float32), ids[None]
            mats = [np.frombuffer(b, dtype="<f4").reshape(-1, d) for _, b in rows]
            s = queries.score_with(lambda e: max_sim_totals(e, mats, metric), len(ids))
            order = np.lexsort((ids, -s))[:top_k]
            return s[order][None], ids[order][None]
        qs = [prepared(np.asarray(q, np.float32).reshape(-1, d), metric) for q in queries]
        best: list[list[tuple[float, int]]] = [[] for _ in qs]
        keep = None if allowed is None else set(allowed.tolist())
        for iid, blob in tables.iter_blobs(self.store.reader(), name):
            if keep is not None and iid not in keep:
                continue
            m = np.frombuffer(blob, dtype="<f4").reshape(-1, d)
            for qi, q in enumerate(qs):
                if is_distance(metric):
                    sim = -((q[:, None, :] - m[None, :, :]) ** 2).sum(-1)
                else:
                    sim = q @ m.T
                best[qi].append((float(sim.max(1).sum()), iid))
        D = np.full((len(qs), top_k), np.nan, np.float32)
        I = np.full((len(qs), top_k), -1, np.int64)
        for qi, hits in enumerate(best):
            hits.sort(key=lambda h: (-h[0], h[1]))
            for j, (s, iid) in enumerate(hits[:top_k]):
                D[qi, j], I[qi, j] = max_sim_score(s, metric), iid
        return D, I

    def _scored(
        self, name: str, scorer: Scorer, top_k: int, allowed: np.ndarray | None, modifier: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """A multi-example query on the sparse vector ``name`` (:mod:`..scorers`): every point holding it (among
        ``allowed``) scored by its dot products with the examples (0 where they share no term, as Qdrant scores
        them; IDF-weighted as a query is). Returns ``(scores, iids)``, each ``(1, <=top_k)``."""
        index = self.sparse[name]
        ids = index.holders()  # ascending
        if allowed is not None:
            ids = ids[np.isin(ids, allowed)]

        def sim(example: SparseVec) -> np.ndarray:
            out = np.zeros(len(ids), np.float32)
            got, scores = index.scores(example, modifier, ids if allowed is not None else None)
            out[np.searchsorted(ids, got)] = scores
            return out

        s = scorer.score_with(sim, len(ids))
        order = np.lexsort((ids, -s))[:top_k]
        return s[order][None], ids[order][None]

    def vectors_of(self, iids: list[int], names: list[str]) -> dict[int, dict[str, Any]]:
        """``{iid: {name: float32 array | SparseVec}}`` of the named vectors among ``names`` the points hold."""
        out = tables.vectors_of(self.store.reader(), iids, names, set(self.dense))
        for vecs in out.values():
            for n, v in vecs.items():
                if n in self.dense and self.dense[n].multivector:
                    vecs[n] = v.reshape(-1, self.dense[n].spec.dimension)
        return out

    def wanted(self, with_vector: Any) -> tuple[bool, list[str]]:
        """``(whether the model-bound vector is asked for, the other named vectors asked for)`` by a read's
        ``with_vector`` (True: all; a list: those names)."""
        b, sel = self.config.bound, with_vector
        others = [n for n in [*self.dense, *self.config.sparse] if sel is True or (isinstance(sel, list) and n in sel)]
        return b is not None and (sel is True or (isinstance(sel, list) and b.name in sel)), others

    def value_counts(self, iids: list[int], names: list[str]) -> tuple[int, int]:
        """``(dense values, sparse entries)`` of the named vectors among ``names`` that the points ``iids`` hold
        (:func:`.store.named.value_counts`: their vectors are not read)."""
        dims = {n: v.spec.dimension for n, v in self.dense.items()}
        return tables.value_counts(self.store.reader(), iids, names, dims)

    def info(self) -> dict[str, Any]:
        """Per named vector: how many points hold it (and, for dense ones, the index's state)."""
        out: dict[str, Any] = {}
        for name, index in self.indexes.items():
            out[name] = {"points": self.counts[name], "trained": index.trained, "vectors": index.ntotal}
        for name in self.config.sparse:
            out[name] = {"points": self.counts[name]}
        return out
