"""The query model of the collections core: what a dialect's search request compiles to.

Each HTTP dialect validates its own request shape (the native API's ``SearchRequest``, Qdrant's ``QueryRequest`` and
legacy ``SearchRequest``) and builds a :class:`SearchQuery`, which the core's search planning
(:class:`.searching.Searcher`, through :meth:`~.service.CollectionService.search`) plans and runs; a query with
prefetches (Qdrant's Query API, the native ``mode: hybrid``) is a tree of :class:`QueryNode`\\ s over them. Plain
Python: no validation happens here (the dialect validated; the planning checks the query against the collection).
How a quantized index is searched is the index layer's :class:`~.index.QuantizationSearch`, part of this model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from service.collections.formula import FormulaSpec
from service.collections.index import QuantizationSearch


@dataclass
class Rerank:
    """A search's second stage (:mod:`.rerank_search`): the first ``candidates`` hits' texts scored against the
    query's text by the reranker ``model`` (None: the first loaded), the best ``top_n`` kept (None: the search's
    ``top_k``); ``weight`` (alpha, in [0, 1]) of the reranker's score in its fusion with the first stage's (1: the
    reranker's score alone; :func:`.rerank_search.fused`)."""

    model: str | None = None
    candidates: int = 100
    top_n: int | None = None
    weight: float = 1.0


@dataclass
class SearchQuery:
    """One search: what a dialect's search request compiles to, and each node's search in a query tree.

    Attributes:
        query: a text (embedded by the collection's model for its model-bound vector; for a sparse vector bound to a
            sparse model, made by that model), a dense vector, a multivector's rows, a sparse ``{indices, values}``,
            ``{text, model}`` (a text for the named sparse model), a multi-example ``{scorer, ...}``
            (:mod:`.scorers`), or None (no search: a scroll, in a query tree).
        top_k: hits asked for. filter: the core's filter grammar (:mod:`.filters`), or None.
        score_threshold: hits scoring below it are left out (None: none). with_payload / with_text: carried by the
            hits. using: the vector searched (None: the collection's default one). exact: score every stored vector
            instead of searching the approximate index.
        mode: ``dense`` (the model-bound vector), ``sparse`` (the sparse vector bound to a sparse model), ``hybrid``
            (a text searched by both, ``candidates`` hits each, fused by ``fusion`` (``rrf`` with ``rrf_k``, or
            ``dbsf``); :func:`.searching.hybrid`), or None (the vector ``using`` names).
        rerank: a second stage (:class:`Rerank`), or None.
        quantization: how a quantized index is searched (:class:`QuantizationSearch`; None: its defaults).
        hnsw_ef: the HNSW graph's search breadth for this search (Qdrant's ``params.hnsw_ef``; at least ``top_k`` is
            used; None: the index's ``ef_search``). No effect on other index types.
    """

    query: Any
    top_k: int = 10
    filter: Any = None
    score_threshold: float | None = None
    with_payload: bool = True
    with_text: bool = True
    using: str | None = None
    exact: bool = False
    mode: Literal["dense", "sparse", "hybrid"] | None = None
    fusion: Literal["rrf", "dbsf"] = "rrf"
    rrf_k: int | None = None
    candidates: int = 100
    rerank: Rerank | None = None
    quantization: QuantizationSearch | None = None
    hnsw_ef: int | None = None


@dataclass
class QueryNode:
    """A query of Qdrant's Query API (Qdrant API reference, "Query points": ``prefetch``, ``query``, ``fusion``):
    without ``prefetch``, the search ``search``; with it, the prefetches run first (each a node, nested) and their
    hits are fused (``fusion``: ``rrf`` with ``rrf_k`` and ``weights``, or ``dbsf``) or, without ``fusion``, re-scored
    by ``search``'s query (a search restricted to the prefetched points). ``search.filter`` applies to this node and
    every node below it (ANDed with theirs, as Qdrant propagates filters into prefetches); ``search.top_k`` is this
    node's limit, ``search.score_threshold`` its threshold (on the fused score too). With ``formula`` (Qdrant's
    ``FormulaQuery``), the prefetched points are re-scored by it instead (:mod:`.formula`). A node whose
    ``search.query`` is None (and has no fusion or formula) pages through its points (those its prefetches found, if
    any) in id order, each scoring 1, as Qdrant answers a query without one."""

    search: SearchQuery
    prefetch: list[QueryNode] = field(default_factory=list)
    fusion: str | None = None
    rrf_k: int | None = None
    weights: list[float] | None = None
    formula: FormulaSpec | None = None
