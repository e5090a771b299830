"""Search planning of the collection service (:meth:`~.service.CollectionService.search`): each search runs on the
vector it names (``using``; default: the collection's default vector, :meth:`~.schema.VectorsConfig.default_using`).
Text queries of the model-bound vector are embedded together (by the collection's exact model), vector queries are
checked against their vector (dimension, magnitude; sparse ``{indices, values}`` for a sparse vector), filters
parsed; searches that differ only in their query run as multi-query backend calls of at most :data:`HITS_PER_CALL`
hits each. A model switch between embedding and searching makes the whole batch run again (up to
:data:`~.errors.RETRIES` times).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from service.collections import formula
from service.collections.costs import check_formula_work
from service.collections.embedding import Embedding
from service.collections.errors import RETRIES, InvalidCollectionRequest, ModelChanged, TooManyItems
from service.collections.filters import Filter
from service.collections.formula_eval import rescore
from service.collections.fusion import fuse
from service.collections.multivector_scoring import multi_scorer_of
from service.collections.point_reads import PointReads
from service.collections.query_model import QueryNode, SearchQuery
from service.collections.schema import SparseVec, dense_value, sparse_vec
from service.collections.scorers import Scorer, scorer_of
from service.collections.shares import Shares
from service.collections.stopping import for_collection
from service.collections.vector_backend import Hit, ReadConsistency, ResponseBudget
from service.collections.vectors import query_problem

HITS_PER_CALL = 1024  # queries of one multi-query backend call ask for at most this many hits (top_k each) together


MAX_PREFETCH_DEPTH = 4  # nesting of prefetches


def _leaves(node: QueryNode) -> int:
    return 1 if not node.prefetch else sum(_leaves(p) for p in node.prefetch)


def _and(left: Any, right: Any) -> Any:
    return right if left is None else left if right is None else {"$and": [left, right]}


def _model_sparse(cfg: Any, pre: str) -> str:
    names = [n for n, v in cfg.sparse.items() if v.model]
    if len(names) != 1:
        raise InvalidCollectionRequest(
            f"mode needs the collection's one sparse vector bound to a sparse model (it has {names}): name it in "
            "'using'",
            f"{pre}mode",
        )
    return names[0]


def _bound_dense(cfg: Any, pre: str) -> str:
    if cfg.bound is None:
        raise InvalidCollectionRequest(
            "mode needs a dense vector bound to the model; the collection has none", f"{pre}mode"
        )
    return cfg.bound.name


def _on_mode(cfg: Any, s: Any, pre: str) -> Any:
    """A native search with ``mode`` ``dense`` or ``sparse`` (or none) as a plain search (no mode) on that vector, or
    on the vector ``using`` names."""
    mode = getattr(s, "mode", None)
    if mode is None:
        return s
    using = s.using if s.using is not None else _bound_dense(cfg, pre) if mode == "dense" else _model_sparse(cfg, pre)
    return replace(s, using=using, mode=None, rerank=None)


def hybrid(cfg: Any, s: Any, pre: str) -> QueryNode:
    """A native search with ``mode: hybrid`` (a text query) as a query tree: the text searched by the model-bound
    dense vector and by the sparse vector bound to a sparse model (``qdrant/bm25``), ``candidates`` hits each, fused
    by ``fusion`` into ``top_k`` (the filter applies to both).

    Raises:
        InvalidCollectionRequest: not a text query, or the collection lacks either vector.
    """
    if not isinstance(s.query, str):
        raise InvalidCollectionRequest("mode hybrid takes a text query", f"{pre}query")
    k, q = max(getattr(s, "candidates", None) or 100, s.top_k), getattr(s, "quantization", None)
    ef = getattr(s, "hnsw_ef", None)
    leaves = [
        QueryNode(
            SearchQuery(s.query, k, None, None, s.with_payload, s.with_text, using, s.exact, quantization=q, hnsw_ef=ef)
        )
        for using in (_bound_dense(cfg, pre), _model_sparse(cfg, pre))
    ]
    top = SearchQuery(None, s.top_k, s.filter, s.score_threshold, s.with_payload, s.with_text)
    return QueryNode(top, leaves, getattr(s, "fusion", None) or "rrf", getattr(s, "rrf_k", None))


class Searcher:
    """Searches and queries of the collections (module docstring): collections and filters read through ``reads``,
    query texts embedded through ``embedding``."""

    def __init__(self, reads: PointReads, embedding: Embedding) -> None:
        self.reads = reads
        self.embedding = embedding
        self.rerank_turns = Shares(0, share=reads.settings.max_concurrent_reranks)  # per collection (rerank_search)

    async def search(
        self,
        name: str,
        searches: Sequence[SearchQuery],
        param: str,
        consistency: ReadConsistency | None = None,
        budget: ResponseBudget | None = None,
    ) -> list[list[Hit]]:
        """One list of hits per search, best first, read at ``consistency`` (default: the settings'; see the module
        docstring). ``param``: ``query`` (one search) or ``searches`` (a batch), used to name
        the field at fault; ``budget``: the request's :class:`~.backend.ResponseBudget`, which the hits of every search
        spend (None: one of ``collections_max_response_bytes`` for these searches).

        Raises:
            CollectionNotFound, TooManyItems, InvalidCollectionRequest, ModelUnavailable, ModelChanged;
            ResponseTooLarge: the hits exceed the budget.
        """
        consistency = consistency or self.reads.read_consistency()
        budget = budget or ResponseBudget(self.reads.settings.max_response_bytes)
        if param == "searches" and len(searches) > self.reads.settings.max_batch_searches:
            raise TooManyItems(
                f"{len(searches)} searches in one request; the maximum is {self.reads.settings.max_batch_searches}",
                "searches",
                "too_many_searches",
            )
        modes = [getattr(s, "mode", None) for s in searches]
        if any(m is not None for m in modes):  # the native API's modes: searches on chosen vectors, or a hybrid query
            cfg = (await self.reads.collection(name)).vectors
            plain = [i for i, m in enumerate(modes) if m != "hybrid"]
            out: list[list[Hit]] = [[] for _ in searches]
            specs = [_on_mode(cfg, searches[i], f"{param}[{i}]." if param == "searches" else "") for i in plain]
            for i, hits in zip(plain, await self.search(name, specs, param, consistency, budget) if specs else []):
                out[i] = hits
            for i in (i for i, m in enumerate(modes) if m == "hybrid"):
                node = hybrid(cfg, searches[i], f"{param}[{i}]." if param == "searches" else "")
                out[i] = await self.query(name, node, consistency, budget=budget)
            return out
        used = budget.used
        for attempt in range(RETRIES):
            try:
                budget.used = used  # a search run again spends again
                return await self._search_once(name, searches, param, consistency, budget)
            except ModelChanged as e:
                if attempt == RETRIES - 1:
                    raise ModelChanged(f"collection {name!r} changed model during the search; retry ({e})") from e
        raise AssertionError("unreachable")

    async def _search_once(
        self,
        name: str,
        searches: Sequence[SearchQuery],
        param: str,
        consistency: ReadConsistency,
        budget: ResponseBudget,
    ) -> list[list[Hit]]:
        c = await self.reads.collection(name)
        cfg, model = c.vectors, dict(c.model) if c.model else None
        plans: list[tuple[SearchQuery, Filter | None, str, int | np.ndarray | SparseVec]] = []
        texts: list[str] = []
        for i, s in enumerate(searches):
            pre = f"{param}[{i}]." if param == "searches" else ""
            if s.top_k > self.reads.settings.max_top_k:
                raise InvalidCollectionRequest(f"top_k must be at most {self.reads.settings.max_top_k}", f"{pre}top_k")
            where = self.reads.parse_filter(s.filter, f"{pre}filter", cfg)
            using = getattr(s, "using", None)
            using = cfg.default_using() if using is None else using
            if using is None:
                raise InvalidCollectionRequest(
                    f"collection {name!r} has several vectors and none is the default: name one in 'using'",
                    f"{pre}using",
                )
            if isinstance(s.query, dict) and "scorer" in s.query:  # a multi-example query, scored over every candidate
                if cfg.kind_of(using, f"{pre}using") == "sparse":
                    plans.append((s, where, using, scorer_of(s.query, "sparse", 0, f"{pre}query")))
                else:
                    spec, of = cfg.dense[using].spec, multi_scorer_of if cfg.dense[using].multivector else scorer_of
                    plans.append((s, where, using, of(s.query, spec.metric, spec.dimension, f"{pre}query")))
                continue
            if cfg.kind_of(using, f"{pre}using") == "sparse":
                q = (
                    s.query
                    if not hasattr(s.query, "indices")
                    else {"indices": s.query.indices, "values": s.query.values}
                )
                if isinstance(q, str) or (isinstance(q, dict) and set(q) == {"text", "model"}):
                    text, mname = (q, cfg.sparse[using].model) if isinstance(q, str) else (q["text"], q["model"])
                    if mname is None:
                        raise InvalidCollectionRequest(
                            f"the sparse vector {using!r} is the client's (no sparse model is bound to it): query it with "
                            "{indices, values}",
                            f"{pre}query",
                        )
                    q = await asyncio.to_thread(self.embedding.sparse_model(mname, f"{pre}query.model").query, text)
                if not isinstance(q, dict) or set(q) != {"indices", "values"}:
                    raise InvalidCollectionRequest(
                        f"the vector {using!r} is sparse: query it with {{indices, values}}", f"{pre}query"
                    )
                plans.append((s, where, using, sparse_vec(q["indices"], q["values"], f"{pre}query")))
                continue
            vec = cfg.dense[using]
            if isinstance(s.query, str):
                if not vec.bound:
                    raise InvalidCollectionRequest(
                        f"the vector {using!r} is client-supplied: query it with a vector, not a text", f"{pre}query"
                    )
                plans.append((s, where, using, len(texts)))
                texts.append(s.query)
                continue
            if isinstance(s.query, dict) or hasattr(s.query, "indices"):
                raise InvalidCollectionRequest(f"the vector {using!r} is dense: query it with a vector", f"{pre}query")
            if vec.multivector:  # a matrix of query rows, scored by MAX_SIM
                plans.append((s, where, using, dense_value(s.query, vec.spec, True, f"{pre}query")))
                continue
            if s.query and isinstance(s.query[0], list):
                raise InvalidCollectionRequest(
                    f"the vector {using!r} is not a multivector: query it with one vector", f"{pre}query"
                )
            v = np.asarray(s.query, dtype=np.float32)
            if len(v) != vec.spec.dimension:
                raise InvalidCollectionRequest(
                    f"query vector has dimension {len(v)}; the vector {using!r} of collection {name!r} has "
                    f"{vec.spec.dimension}",
                    f"{pre}query",
                    "wrong_dimension",
                )
            if (problem := query_problem(v, vec.spec.metric)) is not None:
                raise InvalidCollectionRequest(problem, f"{pre}query")
            plans.append((s, where, using, v))
        qvecs = await self.embedding.embed(c, texts, model, role="query") if texts else None

        # searches that differ only in their query vector go to the backend as one multi-query search (one Milvus
        # RPC, one FAISS call), each group its own bounded backend call
        groups: dict[tuple, list[int]] = {}
        for i, (s, _, using, _) in enumerate(plans):
            key = (
                s.top_k,
                json.dumps(s.filter, sort_keys=True),
                s.score_threshold,
                s.with_payload,
                s.with_text,
                using,
                bool(getattr(s, "exact", False)),
                getattr(s, "quantization", None),
                getattr(s, "hnsw_ef", None),
                i if isinstance(plans[i][3], Scorer) else -1,
            )
            groups.setdefault(key, []).append(i)
        out: list[list[Hit] | None] = [None] * len(plans)
        for members in groups.values():
            s, where, using, _ = plans[members[0]]
            sparse = using in cfg.sparse
            step = max(1, HITS_PER_CALL // s.top_k)  # the budget is checked between calls: no call returns gigabytes
            for k in range(0, len(members), step):
                part = members[k : k + step]
                qs = [qvecs[q] if isinstance(q, int) else q for _, _, _, q in (plans[i] for i in part)]
                hits = await self.reads.backend.run(
                    c.search,
                    qs[0] if isinstance(qs[0], Scorer) else qs if sparse or qs[0].ndim == 2 else np.stack(qs),
                    s.top_k,
                    where,
                    s.score_threshold,
                    s.with_payload,
                    s.with_text,
                    model=model if cfg.dense.get(using) and cfg.dense[using].bound else None,
                    budget=budget,
                    consistency=consistency,
                    using=using,
                    exact=bool(getattr(s, "exact", False)),
                    quantization=getattr(s, "quantization", None),
                    hnsw_ef=getattr(s, "hnsw_ef", None),
                )
                for i, h in zip(part, hits):
                    out[i] = h
        return out  # type: ignore[return-value]

    async def query(
        self,
        name: str,
        node: QueryNode,
        consistency: ReadConsistency | None = None,
        above: Any = None,
        depth: int = 0,
        budget: ResponseBudget | None = None,
    ) -> list[Hit]:
        """The hits of a query with prefetches (:class:`QueryNode`), best first; ``above``: the filter of the nodes
        above (native grammar). ``budget``: the request's, which this query's hits spend (the hits of a search, or the
        fused hits: each prefetch's search spends a budget of its own, as one search; None: each search its own).

        Raises:
            InvalidCollectionRequest: prefetches nested deeper than :data:`MAX_PREFETCH_DEPTH`, a re-scoring over more
                points than ``collections_max_filter_values``, a bad formula or one failing on a point
                (:func:`.formula.parse`, :meth:`.formula.Formula.score`); and what :func:`search` raises.
            TooManyItems: more searches in the tree than ``collections_max_batch_searches``.
            ResponseTooLarge: the hits exceed a budget.
        """
        consistency = consistency or self.reads.read_consistency()
        s = node.search
        where = _and(above, s.filter)
        if depth == 0 and (n := _leaves(node)) > self.reads.settings.max_batch_searches:
            raise TooManyItems(
                f"{n} prefetch searches in one query; the maximum is {self.reads.settings.max_batch_searches} "
                "(collections_max_batch_searches)",
                "prefetch",
                "too_many_searches",
            )
        if not node.prefetch:
            if node.formula is not None:
                raise InvalidCollectionRequest("a formula needs prefetches (it re-scores their points)", "prefetch")
            return await self._search_or_scroll(name, replace(s, filter=where), consistency, budget)
        if depth >= MAX_PREFETCH_DEPTH:
            raise InvalidCollectionRequest(f"prefetch nested more than {MAX_PREFETCH_DEPTH} deep", "prefetch")
        if node.formula is not None:  # checked before any prefetch runs; it reads the payloads of their points
            cfg = (await self.reads.collection(name)).vectors
            fx = formula.parse(node.formula, lambda raw, at: self.reads.parse_filter(raw, at, cfg))
            check_formula_work(self.reads.settings, fx.filters, sum(p.search.top_k for p in node.prefetch))
        # only a formula reads its prefetches' texts and payloads; a fusion reads its fused hits' once
        # (:meth:`_with_rows`), a search restricted to the prefetched points its own hits'
        rescoring = node.formula is not None
        leaves = [
            replace(p, search=replace(p.search, with_payload=rescoring, with_text=s.with_text and rescoring))
            for p in node.prefetch
        ]
        sources = await asyncio.gather(*(self.query(name, p, consistency, where, depth + 1) for p in leaves))
        if node.formula is not None:
            hits = await rescore(self.reads, name, fx, sources, s.top_k, s.score_threshold, s.with_payload)
            if budget is not None:
                budget.spend_hits(hits)
            return hits
        if node.fusion is not None:
            try:
                job = for_collection(name, fuse, node.fusion, sources, s.top_k, node.rrf_k, node.weights)
                fused = await self.reads.backend.run(job)  # up to max_batch_searches x max_top_k hits: off the loop
            except ValueError as e:
                raise InvalidCollectionRequest(str(e), "query") from e
            t = s.score_threshold
            return await self._with_rows(name, [h for h in fused if t is None or h.score >= t], s, budget)
        ids = list(dict.fromkeys(h.id for hits in sources for h in hits))
        if not ids:
            return []
        return await self._search_or_scroll(name, replace(s, filter=_and(where, {"$ids": ids})), consistency, budget)

    async def _with_rows(self, name: str, hits: list[Hit], s: SearchQuery, budget: ResponseBudget | None) -> list[Hit]:
        """``hits`` with their texts and payloads as ``s`` asks (read once, for these hits only), spent from
        ``budget`` (None: not counted) before they are read; a point deleted since it was found is left out, as a
        search started after the delete would.

        Raises:
            ResponseTooLarge: the hits exceed ``budget``.
        """
        if not hits or not (s.with_payload or s.with_text):
            if budget is not None:
                budget.spend_hits(hits)
            return hits
        rows = await self.reads.retrieve(
            name,
            [h.id for h in hits],
            with_payload=s.with_payload,
            with_vectors=False,
            with_text=s.with_text,
            budget=budget,
        )
        got = {(type(p["id"]), p["id"]): p for p in rows}
        return [
            Hit(h.id, h.score, p.get("text"), p.get("payload"))
            for h in hits
            if (p := got.get((type(h.id), h.id))) is not None
        ]

    async def _search_or_scroll(
        self, name: str, s: SearchQuery, consistency: ReadConsistency, budget: ResponseBudget | None
    ) -> list[Hit]:
        """The hits of the search ``s``, or without a query the first ``top_k`` points matching its filter in id order,
        each scoring 1 (a scroll, at the service's consistency)."""
        if s.query is not None:
            return (await self.search(name, [s], "query", consistency, budget))[0]
        points, _ = await self.reads.scroll(name, None, s.top_k, s.filter, False, budget, s.with_text, s.with_payload)
        return [Hit(p["id"], 1.0, p.get("text"), p.get("payload")) for p in points]
