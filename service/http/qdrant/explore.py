"""Qdrant's Explore queries (``recommend``, ``discover``, ``context``) as native queries of the collections core.

Qdrant API reference (https://api.qdrant.tech/api-reference, ``QueryRequest.query``) and concepts ("Explore the
data", https://qdrant.tech/documentation/concepts/explore/): every example is a vector, a point id (its stored vector
of the query's ``using`` vector, read from ``lookup_from`` when given) or a ``Document`` (embedded here by the
collection's model, for its model-bound vector). The ids of points of the searched collection named as examples are
left out of the hits, as in Qdrant.

* ``{"recommend": {positive, negative, strategy}}``: ``average_vector`` (Qdrant's default) becomes one query vector
  (:func:`~service.collections.vectors.average_vector`); ``best_score`` and ``sum_scores`` become a scorer query
  (:mod:`service.collections.scorers`) that scores every candidate against every example;
* ``{"discover": {target, context: [{positive, negative}, ...]}}`` and ``{"context": [{positive, negative}, ...]}``:
  scorer queries too;
* ``{"relevance_feedback": {target, feedback: [{example, score}, ...], strategy: {naive: {a, b, c}}}}``: the
  scorer query ``relevance_feedback`` (Qdrant's naive feedback strategy, the only one it defines).

On a sparse vector the examples are sparse vectors or point ids (their stored sparse vectors); ``average_vector``
averages them index by index (:func:`sparse_average`), the other kinds score every point holding the vector.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import TypeAdapter, ValidationError

from service.collections.errors import InvalidCollectionRequest, PointNotFound, TooManyItems
from service.collections.metric import unit_rows
from service.collections.schema import VectorsConfig
from service.collections.service import CollectionService
from service.collections.vectors import average_vector
from service.http.qdrant.models import Document, Example, LookupLocation, RecommendInput, SparseVector
from service.http.qdrant.points import check_model
from service.http.qdrant.reads import points_by_id
from service.http.qdrant.vectors import all_vectors

_EXAMPLE = TypeAdapter(Example)
Found = tuple[Any, list, dict | None]  # (native query, ids to leave out, the model of the vectors read or made)


def source(name: str, using: str | None, lookup: LookupLocation | None) -> tuple[str, str | None]:
    """The collection and vector that point ids of a query name: ``lookup_from``'s, else the searched ones."""
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


def _bad(e: ValidationError, param: str) -> InvalidCollectionRequest:
    where = ".".join([param, *(str(x) for x in e.errors()[0]["loc"])])
    return InvalidCollectionRequest(f"{where}: {e.errors()[0]['msg']}", param=where)


async def _rows(
    svc: CollectionService,
    name: str,
    sides: dict[str, list],
    param: str,
    using: str | None,
    lookup: LookupLocation | None,
) -> tuple[dict[str, np.ndarray], list, dict | None, str]:
    """The example vectors of each side (float64 ``(k, d)``, unit rows on a cosine vector, as Qdrant preprocesses
    them), the ids to leave out, the model of the vectors read or embedded (None: none) and the vector's metric.

    Raises:
        InvalidCollectionRequest: a sparse vector, a ``Document`` for a client's vector or of another model, a vector
            of the wrong dimension. TooManyItems: more examples than ``collections_max_filter_values``.
        PointNotFound: an example id that is not stored (with that vector).
    """
    if (n := sum(len(xs) for xs in sides.values())) > (cap := svc.settings.max_filter_values):
        raise TooManyItems(
            f"{n} examples; the maximum is {cap} (collections_max_filter_values)", param, "too_many_examples"
        )
    c = await svc.collection(name)
    vname = vector_name(c.vectors, using, param)
    if vname in c.vectors.sparse:
        return await _sparse_rows(svc, name, sides, param, using, lookup)
    spec, bound = c.vectors.dense[vname].spec, c.vectors.dense[vname].bound
    texts: list[str] = []
    ids: list[int | str] = []
    for side, examples in sides.items():
        for i, x in enumerate(examples):
            at = f"{param}.{side}[{i}]"
            if isinstance(x, Document):
                if not bound:
                    raise InvalidCollectionRequest(f"the vector {vname!r} is the client's: no Document examples", at)
                texts.append(check_model(x, c.model, name, at))
            elif isinstance(x, list) and len(x) != spec.dimension:
                raise InvalidCollectionRequest(
                    f"{at} has dimension {len(x)}; the vector {vname!r} has {spec.dimension}", at, "wrong_dimension"
                )
            elif not isinstance(x, list):
                ids.append(x)
    src, src_using = source(name, using, lookup)
    sc = c if src == name and lookup is None else await svc.collection(src)
    sname = vname if sc is c else vector_name(sc.vectors, src_using, param)
    found = await points_by_id(svc, src, ids) if ids else {}
    stored = {k: all_vectors(p, sc.vectors).get(sname) for k, p in found.items()}
    if missing := [x for x in ids if stored.get((type(x), x)) is None]:
        raise PointNotFound(f"No point with id {missing[0]} found (holding the vector {sname!r})")
    if bad := [x for x in ids if len(stored[(type(x), x)]) != spec.dimension]:
        raise InvalidCollectionRequest(
            f"{param}: point {bad[0]}'s vector {sname!r} is not of dimension {spec.dimension}", param, "wrong_dimension"
        )
    model = c.model and dict(c.model) if texts or (ids and lookup is None) else None
    embedded = iter(await svc.embed(c, texts, role="query")) if texts else iter(())

    def vector(x: Any) -> Any:  # in the order the texts were gathered
        return x if isinstance(x, list) else next(embedded) if isinstance(x, Document) else stored[(type(x), x)]

    d = spec.dimension
    rows = {side: np.array([vector(x) for x in xs], dtype=np.float64).reshape(-1, d) for side, xs in sides.items()}
    if spec.metric == "cosine":
        rows = {side: unit_rows(r) for side, r in rows.items()}
    return rows, ([] if lookup is not None else list(dict.fromkeys(ids))), model, spec.metric


async def _sparse_rows(
    svc: CollectionService,
    name: str,
    sides: dict[str, list],
    param: str,
    using: str | None,
    lookup: LookupLocation | None,
) -> tuple[dict[str, list], list, dict | None, str]:
    """:func:`_rows` for a sparse vector: each side's examples as ``{indices, values}`` (sparse vectors given, or the
    stored ones of the ids named), the ids to leave out, no model, and the metric ``sparse``.

    Raises:
        InvalidCollectionRequest: a dense vector or a ``Document`` as an example. PointNotFound: an id not stored
            (with that vector).
    """
    ids = [x for xs in sides.values() for x in xs if isinstance(x, (int, str))]
    src, src_using = source(name, using, lookup)
    sc = await svc.collection(src)
    sname = vector_name(sc.vectors, src_using, param)
    found = await points_by_id(svc, src, ids) if ids else {}
    stored = {k: all_vectors(p, sc.vectors).get(sname) for k, p in found.items()}
    if missing := [x for x in ids if not isinstance(stored.get((type(x), x)), dict)]:
        raise PointNotFound(f"No point with id {missing[0]} found (holding the sparse vector {sname!r})")
    out: dict[str, list] = {}
    for side, xs in sides.items():
        out[side] = []
        for i, x in enumerate(xs):
            if isinstance(x, SparseVector):
                out[side].append(x.model_dump())
            elif isinstance(x, (int, str)):
                out[side].append(stored[(type(x), x)])
            else:
                raise InvalidCollectionRequest(
                    f"{param}.{side}[{i}]: the vector is sparse: give a sparse vector or a point id",
                    f"{param}.{side}[{i}]",
                )
    return out, ([] if lookup is not None else list(dict.fromkeys(ids))), None, "sparse"


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


async def recommend(
    svc: CollectionService,
    name: str,
    raw: Any,
    param: str,
    using: str | None = None,
    lookup: LookupLocation | None = None,
) -> Found:
    """``{"recommend": RecommendInput}`` (module docstring).

    Raises:
        as :func:`_rows`; InvalidCollectionRequest: malformed input, no positive example for ``average_vector``, no
            example at all.
    """
    try:
        rec = RecommendInput.model_validate(raw)
    except ValidationError as e:
        raise _bad(e, param) from None
    sides = {"positive": rec.positive or [], "negative": rec.negative or []}
    strategy = rec.strategy or "average_vector"
    if strategy == "average_vector" and not sides["positive"]:
        raise InvalidCollectionRequest("the average_vector strategy needs a positive example", f"{param}.positive")
    if not sides["positive"] and not sides["negative"]:
        raise InvalidCollectionRequest("a recommendation needs an example", f"{param}.positive")
    rows, ids, model, metric = await _rows(svc, name, sides, param, using, lookup)
    if metric == "sparse":
        if strategy == "average_vector":
            return sparse_average(rows["positive"], rows["negative"]), ids, None
        return {"scorer": strategy, **rows}, ids, None
    if strategy == "average_vector":
        return average_vector(rows["positive"], rows["negative"]).tolist(), ids, model
    return {"scorer": strategy, **{k: v.tolist() for k, v in rows.items()}}, ids, model


def _pairs(raw: Any, param: str, empty: bool = False) -> list[tuple[Any, Any]]:
    """The ``(positive, negative)`` examples of a ``ContextPair`` or a list of them (``empty``: none allowed)."""
    raw = [] if raw is None and empty else [raw] if isinstance(raw, dict) else raw
    if not isinstance(raw, list) or not (raw or empty):
        raise InvalidCollectionRequest(f"{param} must be a context pair or a non-empty list of them", param)
    out = []
    for i, p in enumerate(raw):
        if not isinstance(p, dict) or set(p) != {"positive", "negative"}:
            raise InvalidCollectionRequest(f"{param}[{i}] must be {{positive, negative}}", f"{param}[{i}]")
        try:
            out.append((_EXAMPLE.validate_python(p["positive"]), _EXAMPLE.validate_python(p["negative"])))
        except ValidationError as e:
            raise _bad(e, f"{param}[{i}]") from None
    return out


async def _pair_query(
    svc: CollectionService,
    name: str,
    kind: str,
    pairs: list,
    target: Any,
    param: str,
    using: str | None,
    lookup: LookupLocation | None,
) -> Found:
    sides = {
        "target": [] if target is None else [target],
        "positive": [p for p, _ in pairs],
        "negative": [n for _, n in pairs],
    }
    rows, ids, model, metric = await _rows(svc, name, sides, param, using, lookup)
    as_json = (lambda v: v) if metric == "sparse" else (lambda v: v.tolist())  # noqa: E731
    query: dict[str, Any] = {
        "scorer": kind,
        "pairs": [[as_json(p), as_json(n)] for p, n in zip(rows["positive"], rows["negative"])],
    }
    if target is not None:
        query["target"] = as_json(rows["target"][0])
    return query, ids, model


async def discover(
    svc: CollectionService,
    name: str,
    raw: Any,
    param: str,
    using: str | None = None,
    lookup: LookupLocation | None = None,
) -> Found:
    """``{"discover": {target, context}}`` (module docstring).

    Raises:
        as :func:`_rows`; InvalidCollectionRequest: malformed input.
    """
    if not isinstance(raw, dict) or set(raw) != {"target", "context"}:
        raise InvalidCollectionRequest(f"{param} must be {{target, context}}", param)
    try:
        target = _EXAMPLE.validate_python(raw["target"])
    except ValidationError as e:
        raise _bad(e, f"{param}.target") from None
    pairs = _pairs(raw["context"], f"{param}.context", empty=True)  # a target alone: Qdrant allows it
    return await _pair_query(svc, name, "discover", pairs, target, param, using, lookup)


async def context(
    svc: CollectionService,
    name: str,
    raw: Any,
    param: str,
    using: str | None = None,
    lookup: LookupLocation | None = None,
) -> Found:
    """``{"context": [{positive, negative}, ...]}`` (module docstring).

    Raises:
        as :func:`_rows`; InvalidCollectionRequest: malformed input.
    """
    return await _pair_query(svc, name, "context", _pairs(raw, param), None, param, using, lookup)


async def relevance_feedback(
    svc: CollectionService,
    name: str,
    raw: Any,
    param: str,
    using: str | None = None,
    lookup: LookupLocation | None = None,
) -> Found:
    """``{"relevance_feedback": {target, feedback, strategy}}`` (module docstring).

    Raises:
        as :func:`_rows`; InvalidCollectionRequest: malformed input, a strategy other than ``naive``.
    """
    if not isinstance(raw, dict) or set(raw) != {"target", "feedback", "strategy"}:
        raise InvalidCollectionRequest(f"{param} must be {{target, feedback, strategy}}", param)
    naive = raw["strategy"].get("naive") if isinstance(raw["strategy"], dict) else None
    if set(raw["strategy"] or {}) != {"naive"} or not isinstance(naive, dict) or set(naive) != {"a", "b", "c"}:
        raise InvalidCollectionRequest(f"{param}.strategy must be {{naive: {{a, b, c}}}}", f"{param}.strategy")
    feedback = raw["feedback"] if isinstance(raw["feedback"], list) else None
    if feedback is None or not all(isinstance(f, dict) and set(f) == {"example", "score"} for f in feedback):
        raise InvalidCollectionRequest(f"{param}.feedback must be a list of {{example, score}}", f"{param}.feedback")
    try:
        target = _EXAMPLE.validate_python(raw["target"])
        examples = [_EXAMPLE.validate_python(f["example"]) for f in feedback]
    except ValidationError as e:
        raise _bad(e, param) from None
    rows, ids, model, metric = await _rows(svc, name, {"target": [target], "feedback": examples}, param, using, lookup)
    as_json = (lambda v: v) if metric == "sparse" else (lambda v: v.tolist())  # noqa: E731
    query = {
        "scorer": "relevance_feedback",
        "target": as_json(rows["target"][0]),
        **naive,
        "feedback": [[as_json(r), f["score"]] for r, f in zip(rows["feedback"], feedback)],
    }
    return query, ids, model
