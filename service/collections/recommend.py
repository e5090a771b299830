"""Queries by example (Qdrant's Explore queries ``recommend``, ``discover``, ``context`` and ``relevance_feedback``,
https://qdrant.tech/documentation/concepts/explore/), made into queries of the core's search planning.

Every example is a dense vector, a sparse ``{indices, values}``, a point id (its stored vector of the query's vector,
read from :class:`Lookup`'s collection and vector when given) or a :class:`Text` (embedded by the collection's model,
for its model-bound vector). A query answers ``(query, ids to leave out, model)``: ``query`` a vector or a scorer
query (:mod:`.scorers`), the ids of the searched collection's points named as examples (left out of the hits, as in
Qdrant; none when the ids were looked up elsewhere), and the collection's model (a copy) when a vector was read or
embedded here (a model switch before the search makes it stale: the caller runs the query again), else None.

* :func:`recommend`: ``average_vector`` (Qdrant's default) becomes one query vector
  (:func:`~.vectors.average_vector`; on a sparse vector :func:`sparse_average`); ``best_score`` and ``sum_scores``
  a scorer query that scores every candidate against every example;
* :func:`discover` (a target and context pairs) and :func:`context` (context pairs): scorer queries;
* :func:`relevance_feedback`: the scorer ``relevance_feedback`` (Qdrant's naive strategy, ``a``, ``b``, ``c``).

Dense examples are float64 rows, unit rows on a cosine vector (as Qdrant preprocesses them). On a multivector every
example is a matrix (``(m, d)`` rows, given or stored), as qdrant-client's local mode takes them: ``average_vector``
makes one query matrix of the positive examples' rows and the negated rows of the negative ones
(:func:`multi_average`); the other kinds are scorer queries of matrices (MAX_SIM to each example);
``relevance_feedback`` is not offered there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.collections.errors import InvalidCollectionRequest, PointNotFound, TooManyItems
from service.collections.metric import normalised
from service.collections.schema import VectorsConfig
from service.collections.service import CollectionService
from service.collections.vectors import average_vector

#: ``(query, ids to leave out, the collection's model when a vector was read or made here)``
Found = tuple[Any, list, dict | None]
#: the stored vector ``vector`` (floats or ``{indices, values}``; None: not held) of the stored points among ``ids``
#: of ``collection`` (whose vectors are ``cfg``), keyed by ``(type(id), id)``: ``read(collection, cfg, ids, vector)``
StoredVectors = Callable[[str, VectorsConfig, list[int | str], str], Awaitable[dict[tuple[type, Any], Any]]]
#: what :meth:`Examples.rows` answers as the metric of a multivector's examples (matrices)
MULTIVECTOR = "multivector"


@dataclass(frozen=True)
class Lookup:
    """Where the point ids of a query are read (Qdrant's ``LookupLocation``): the ``collection`` (a name or alias)
    and its ``vector`` (None: the query's)."""

    collection: str
    vector: str | None = None


@dataclass(frozen=True)
class Text:
    """An example given as a text (Qdrant's ``Document``), embedded by the collection's model for its model-bound
    vector. ``check(source, model, collection, param)`` answers the text of the dialect's ``source`` once the
    collection's ``model`` is known, raising when that model cannot take it (the dialect's rules: the model it
    names, its options)."""

    source: Any
    check: Callable[[Any, dict[str, Any], str, str], str]


def source(name: str, using: str | None, lookup: Lookup | None) -> tuple[str, str | None]:
    """The collection and vector that point ids of a query name: ``lookup``'s, else the searched ones."""
    if lookup is None:
        return name, using
    return lookup.collection, lookup.vector if lookup.vector is not None else using


def vector_name(cfg: VectorsConfig, using: str | None, param: str) -> str:
    """The vector a query uses: ``using``, else the collection's default one.

    Raises:
        InvalidCollectionRequest: no such vector, or no default one.
    """
    name = cfg.default_using() if using is None else using
    if name is None:
        raise InvalidCollectionRequest("the collection has several vectors: name one in 'using'", param="using")
    cfg.kind_of(name, "using")
    return name


@dataclass
class Examples:
    """Where a query's examples are resolved: collection ``name``, its vector ``using`` (None: the default one),
    point ids read from ``lookup`` (None: from ``name``) by ``read``."""

    svc: CollectionService
    name: str
    using: str | None
    lookup: Lookup | None
    read: StoredVectors

    async def rows(self, sides: dict[str, list], param: str) -> tuple[dict[str, Any], list, dict | None, str]:
        """The example vectors of each side (dense: float64 ``(k, d)``; sparse: a list of ``{indices, values}``),
        the ids to leave out, the model of the vectors read or embedded (None: none) and the vector's metric
        (``sparse`` for a sparse vector).

        Raises:
            InvalidCollectionRequest: a :class:`Text` for a client's or a sparse vector (or one the model refuses), a
                vector of the wrong dimension, a dense vector on a sparse one. TooManyItems: more examples than
                ``collections_max_filter_values``. PointNotFound: an example id that is not stored (with that vector).
        """
        svc, name, using, lookup = self.svc, self.name, self.using, self.lookup
        if (n := sum(len(xs) for xs in sides.values())) > (cap := svc.settings.max_filter_values):
            raise TooManyItems(
                f"{n} examples; the maximum is {cap} (collections_max_filter_values)", param, "too_many_examples"
            )
        c = await svc.collection(name)
        vname = vector_name(c.vectors, using, param)
        if vname in c.vectors.sparse:
            return await self._sparse_rows(sides, param)
        if c.vectors.dense[vname].multivector:
            return await self._multi_rows(sides, param, c.vectors.dense[vname].spec.dimension)
        spec, bound = c.vectors.dense[vname].spec, c.vectors.dense[vname].bound
        texts: list[str] = []
        ids: list[int | str] = []
        for side, examples in sides.items():
            for i, x in enumerate(examples):
                at = f"{param}.{side}[{i}]"
                if isinstance(x, Text):
                    if not bound:
                        raise InvalidCollectionRequest(
                            f"the vector {vname!r} is the client's: no Document examples", at
                        )
                    texts.append(x.check(x.source, c.model, name, at))
                elif isinstance(x, list) and x and isinstance(x[0], list):
                    raise InvalidCollectionRequest(
                        f"{at} is a matrix; the vector {vname!r} is not a multivector: give one vector",
                        at,
                        "wrong_dimension",
                    )
                elif isinstance(x, list) and len(x) != spec.dimension:
                    raise InvalidCollectionRequest(
                        f"{at} has dimension {len(x)}; the vector {vname!r} has {spec.dimension}", at, "wrong_dimension"
                    )
                elif not isinstance(x, list):
                    ids.append(x)
        src, src_using = source(name, using, lookup)
        sc = c if src == name and lookup is None else await svc.collection(src)
        sname = vname if sc is c else vector_name(sc.vectors, src_using, param)
        stored = await self.read(src, sc.vectors, ids, sname) if ids else {}
        if missing := [x for x in ids if stored.get((type(x), x)) is None]:
            raise PointNotFound(f"No point with id {missing[0]} found (holding the vector {sname!r})")
        if bad := [x for x in ids if len(stored[(type(x), x)]) != spec.dimension]:
            raise InvalidCollectionRequest(
                f"{param}: point {bad[0]}'s vector {sname!r} is not of dimension {spec.dimension}",
                param,
                "wrong_dimension",
            )
        model = c.model and dict(c.model) if texts or (ids and lookup is None) else None
        embedded = iter(await svc.embed(c, texts, role="query")) if texts else iter(())

        def vector(x: Any) -> Any:  # in the order the texts were gathered
            return x if isinstance(x, list) else next(embedded) if isinstance(x, Text) else stored[(type(x), x)]

        d = spec.dimension
        rows = {side: np.array([vector(x) for x in xs], dtype=np.float64).reshape(-1, d) for side, xs in sides.items()}
        rows = {side: normalised(r, spec.metric) for side, r in rows.items()}
        return rows, ([] if lookup is not None else list(dict.fromkeys(ids))), model, spec.metric

    async def _sparse_rows(self, sides: dict[str, list], param: str) -> tuple[dict[str, Any], list, None, str]:
        """:meth:`rows` for a sparse vector: each side's examples as ``{indices, values}`` (sparse vectors given, or
        the stored ones of the ids named), the ids to leave out, no model, and the metric ``sparse``.

        Raises:
            InvalidCollectionRequest: a dense vector or a :class:`Text` as an example. PointNotFound: an id not
                stored (with that vector).
        """
        ids = [x for xs in sides.values() for x in xs if isinstance(x, (int, str))]
        src, src_using = source(self.name, self.using, self.lookup)
        sc = await self.svc.collection(src)
        sname = vector_name(sc.vectors, src_using, param)
        stored = await self.read(src, sc.vectors, ids, sname) if ids else {}
        if missing := [x for x in ids if not isinstance(stored.get((type(x), x)), dict)]:
            raise PointNotFound(f"No point with id {missing[0]} found (holding the sparse vector {sname!r})")
        out: dict[str, Any] = {}
        for side, xs in sides.items():
            out[side] = []
            for i, x in enumerate(xs):
                if isinstance(x, dict):
                    out[side].append(x)
                elif isinstance(x, (int, str)):
                    out[side].append(stored[(type(x), x)])
                else:
                    raise InvalidCollectionRequest(
                        f"{param}.{side}[{i}]: the vector is sparse: give a sparse vector or a point id",
                        f"{param}.{side}[{i}]",
                    )
        return out, ([] if self.lookup is not None else list(dict.fromkeys(ids))), None, "sparse"

    async def _multi_rows(self, sides: dict[str, list], param: str, d: int) -> tuple[dict[str, Any], list, None, str]:
        """:meth:`rows` for a multivector of ``d`` floats a row: each side's examples as float64 matrices ``(m, d)``
        (matrices given, or the stored ones of the ids named), the ids to leave out, no model, and the metric
        :data:`MULTIVECTOR`.

        Raises:
            InvalidCollectionRequest: an example that is no matrix of finite rows of ``d`` floats (a single vector, a
                sparse vector, a text; ``wrong_dimension``). PointNotFound: an id not stored (with that vector).
        """
        ids = [x for xs in sides.values() for x in xs if isinstance(x, (int, str))]
        src, src_using = source(self.name, self.using, self.lookup)
        sc = await self.svc.collection(src)
        sname = vector_name(sc.vectors, src_using, param)
        stored = await self.read(src, sc.vectors, ids, sname) if ids else {}
        if missing := [x for x in ids if stored.get((type(x), x)) is None]:
            raise PointNotFound(f"No point with id {missing[0]} found (holding the vector {sname!r})")
        out: dict[str, Any] = {}
        for side, xs in sides.items():
            out[side] = []
            for i, x in enumerate(xs):
                m = _matrix(stored[(type(x), x)] if isinstance(x, (int, str)) else x, d)
                if m is None:
                    at = f"{param}.{side}[{i}]"
                    what = f"point {x}'s vector {sname!r}" if isinstance(x, (int, str)) else at
                    raise InvalidCollectionRequest(
                        f"{what}: the vector is a multivector: an example is a point id or finite rows of {d} floats",
                        at,
                        "wrong_dimension",
                    )
                out[side].append(m)
        return out, ([] if self.lookup is not None else list(dict.fromkeys(ids))), None, MULTIVECTOR


def _matrix(x: Any, d: int) -> np.ndarray | None:
    """float64 ``(m, d)`` (``m >= 1``) of ``x``, or None when it is no such matrix of finite numbers."""
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return a if a.ndim == 2 and a.shape[0] >= 1 and a.shape[1] == d and bool(np.isfinite(a).all()) else None


def multi_average(positive: list[np.ndarray], negative: list[np.ndarray]) -> np.ndarray:
    """Qdrant's ``average_vector`` recommendation on a multivector (qdrant-client's local mode): one query matrix of
    every positive example's rows followed by every negative example's rows negated (``(sum of m_i, d)``)."""
    return np.concatenate([*positive, *(-n for n in negative)])


def sparse_average(positive: list[dict], negative: list[dict]) -> dict[str, list]:
    """Qdrant's ``average_vector`` recommendation on sparse vectors: ``avg(positive)``, or ``avg(positive) +
    (avg(positive) - avg(negative))`` with negatives, averaging index by index (an index absent from a vector counts
    0), as ``{indices, values}`` sorted by index."""

    def avg(vs: list[dict]) -> dict[int, float]:
        acc: dict[int, float] = {}
        for v in vs:
            for i, x in zip(v["indices"], v["values"]):
                acc[i] = acc.get(i, 0.0) + float(x)
        return {i: x / len(vs) for i, x in acc.items()} if vs else {}

    p, n = avg(positive), avg(negative)
    merged = {i: 2 * p.get(i, 0.0) - n.get(i, 0.0) for i in set(p) | set(n)} if negative else p
    keys = sorted(merged)
    return {"indices": keys, "values": [merged[i] for i in keys]}


def _as_json(metric: str) -> Callable[[Any], Any]:
    """A row as the scorer query carries it: sparse ``{indices, values}`` as is, a dense row as floats."""
    return (lambda v: v) if metric == "sparse" else (lambda v: v.tolist())


async def recommend(ex: Examples, positive: list, negative: list, strategy: str, param: str) -> Found:
    """Qdrant's ``RecommendInput``: ``positive`` and ``negative`` examples by ``strategy`` (``average_vector``,
    ``best_score`` or ``sum_scores``; module docstring).

    Raises:
        as :meth:`Examples.rows`; InvalidCollectionRequest: no positive example for ``average_vector``, no example.
    """
    if strategy == "average_vector" and not positive:
        raise InvalidCollectionRequest("the average_vector strategy needs a positive example", f"{param}.positive")
    if not positive and not negative:
        raise InvalidCollectionRequest("a recommendation needs an example", f"{param}.positive")
    rows, ids, model, metric = await ex.rows({"positive": positive, "negative": negative}, param)
    if metric == MULTIVECTOR:
        if strategy == "average_vector":
            return multi_average(rows["positive"], rows["negative"]).tolist(), ids, None
        return {"scorer": strategy, **{k: [m.tolist() for m in v] for k, v in rows.items()}}, ids, None
    if metric == "sparse":
        if strategy == "average_vector":
            return sparse_average(rows["positive"], rows["negative"]), ids, None
        return {"scorer": strategy, **rows}, ids, None
    if strategy == "average_vector":
        return average_vector(rows["positive"], rows["negative"]).tolist(), ids, model
    return {"scorer": strategy, **{k: v.tolist() for k, v in rows.items()}}, ids, model


async def pairs_query(ex: Examples, kind: str, pairs: list[tuple[Any, Any]], target: Any, param: str) -> Found:
    """The scorer query ``kind`` (``discover``: a ``target`` and context ``pairs``; ``context``: ``pairs``, no
    target) of ``(positive, negative)`` example pairs.

    Raises:
        as :meth:`Examples.rows`.
    """
    sides = {
        "target": [] if target is None else [target],
        "positive": [p for p, _ in pairs],
        "negative": [n for _, n in pairs],
    }
    rows, ids, model, metric = await ex.rows(sides, param)
    as_json = _as_json(metric)
    query: dict[str, Any] = {
        "scorer": kind,
        "pairs": [[as_json(p), as_json(n)] for p, n in zip(rows["positive"], rows["negative"])],
    }
    if target is not None:
        query["target"] = as_json(rows["target"][0])
    return query, ids, model


async def relevance_feedback(
    ex: Examples, target: Any, feedback: list[tuple[Any, Any]], naive: dict[str, Any], param: str
) -> Found:
    """The scorer query ``relevance_feedback``: the ``target`` and the ``(example, score)`` ``feedback``, weighted by
    Qdrant's naive strategy ``{a, b, c}``.

    Raises:
        as :meth:`Examples.rows`; InvalidCollectionRequest (``unsupported``): a multivector.
    """
    rows, ids, model, metric = await ex.rows({"target": [target], "feedback": [x for x, _ in feedback]}, param)
    if metric == MULTIVECTOR:
        raise InvalidCollectionRequest(
            "relevance_feedback on a multivector is not supported", f"{param}.target", "unsupported"
        )
    as_json = _as_json(metric)
    query = {
        "scorer": "relevance_feedback",
        "target": as_json(rows["target"][0]),
        **naive,
        "feedback": [[as_json(r), score] for r, (_, score) in zip(rows["feedback"], feedback)],
    }
    return query, ids, model
