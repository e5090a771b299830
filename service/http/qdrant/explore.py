"""Qdrant's Explore queries (``recommend``, ``discover``, ``context``, ``relevance_feedback``) translated onto the
collections core's queries by example (:mod:`service.collections.recommend`, which has the semantics).

Qdrant API reference (https://api.qdrant.tech/api-reference, ``QueryRequest.query``) and concepts ("Explore the
data", https://qdrant.tech/documentation/concepts/explore/): every example is a vector, a point id (its stored vector
of the query's ``using`` vector, read from ``lookup_from`` when given), a sparse vector or a ``Document`` (embedded
here by the collection's model, for its model-bound vector; :func:`.points.check_model`). The ids of points of the
searched collection named as examples are left out of the hits, as in Qdrant.

* ``{"recommend": {positive, negative, strategy}}`` (``average_vector``, Qdrant's default, ``best_score``,
  ``sum_scores``);
* ``{"discover": {target, context: [{positive, negative}, ...]}}`` and ``{"context": [{positive, negative}, ...]}``;
* ``{"relevance_feedback": {target, feedback: [{example, score}, ...], strategy: {naive: {a, b, c}}}}``.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from service.collections import recommend as by_example
from service.collections.errors import InvalidCollectionRequest
from service.collections.recommend import Examples, Found, Lookup, Text
from service.collections.schema import VectorsConfig
from service.collections.service import CollectionService
from service.http.qdrant.models import Document, Example, LookupLocation, RecommendInput, SparseVector
from service.http.qdrant.points import check_model
from service.http.qdrant.reads import points_by_id
from service.http.qdrant.vectors import all_vectors

_EXAMPLE = TypeAdapter(Example)


def lookup_of(lookup: LookupLocation | None) -> Lookup | None:
    """The core's :class:`~service.collections.recommend.Lookup` of Qdrant's ``lookup_from``."""
    return None if lookup is None else Lookup(lookup.collection, lookup.vector)


def _example(x: Any) -> Any:
    """The core's example of a Qdrant example: a ``Document`` as a :class:`~service.collections.recommend.Text`
    (checked by :func:`.points.check_model`), a sparse vector as ``{indices, values}``, a vector or id as is."""
    if isinstance(x, Document):
        return Text(x, check_model)
    if isinstance(x, SparseVector):
        return x.model_dump()
    return x


def _examples(svc: CollectionService, name: str, using: str | None, lookup: LookupLocation | None) -> Examples:
    """Where the examples of a query on ``name``'s vector ``using`` are resolved, the stored vectors of their ids
    read by :func:`.reads.points_by_id`."""

    async def read(collection: str, cfg: VectorsConfig, ids: list[int | str], vector: str) -> dict[Any, Any]:
        found = await points_by_id(svc, collection, ids)
        return {k: all_vectors(p, cfg).get(vector) for k, p in found.items()}

    return Examples(svc, name, using, lookup_of(lookup), read)


def _bad(e: ValidationError, param: str) -> InvalidCollectionRequest:
    where = ".".join([param, *(str(x) for x in e.errors()[0]["loc"])])
    return InvalidCollectionRequest(f"{where}: {e.errors()[0]['msg']}", param=where)


async def recommend(
    svc: CollectionService,
    name: str,
    raw: Any,
    param: str,
    using: str | None = None,
    lookup: LookupLocation | None = None,
) -> Found:
    """``{"recommend": RecommendInput}`` (:func:`service.collections.recommend.recommend`).

    Raises:
        InvalidCollectionRequest: malformed input; and what the core's recommendation raises.
    """
    try:
        rec = RecommendInput.model_validate(raw)
    except ValidationError as e:
        raise _bad(e, param) from None
    positive, negative = [_example(x) for x in rec.positive or []], [_example(x) for x in rec.negative or []]
    ex = _examples(svc, name, using, lookup)
    return await by_example.recommend(ex, positive, negative, rec.strategy or "average_vector", param)


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
            pos, neg = _EXAMPLE.validate_python(p["positive"]), _EXAMPLE.validate_python(p["negative"])
        except ValidationError as e:
            raise _bad(e, f"{param}[{i}]") from None
        out.append((_example(pos), _example(neg)))
    return out


async def discover(
    svc: CollectionService,
    name: str,
    raw: Any,
    param: str,
    using: str | None = None,
    lookup: LookupLocation | None = None,
) -> Found:
    """``{"discover": {target, context}}`` (:func:`service.collections.recommend.pairs_query`).

    Raises:
        InvalidCollectionRequest: malformed input; and what the core's query raises.
    """
    if not isinstance(raw, dict) or set(raw) != {"target", "context"}:
        raise InvalidCollectionRequest(f"{param} must be {{target, context}}", param)
    try:
        target = _EXAMPLE.validate_python(raw["target"])
    except ValidationError as e:
        raise _bad(e, f"{param}.target") from None
    pairs = _pairs(raw["context"], f"{param}.context", empty=True)  # a target alone: Qdrant allows it
    ex = _examples(svc, name, using, lookup)
    return await by_example.pairs_query(ex, "discover", pairs, _example(target), param)


async def context(
    svc: CollectionService,
    name: str,
    raw: Any,
    param: str,
    using: str | None = None,
    lookup: LookupLocation | None = None,
) -> Found:
    """``{"context": [{positive, negative}, ...]}`` (:func:`service.collections.recommend.pairs_query`).

    Raises:
        InvalidCollectionRequest: malformed input; and what the core's query raises.
    """
    pairs = _pairs(raw, param)
    return await by_example.pairs_query(_examples(svc, name, using, lookup), "context", pairs, None, param)


async def relevance_feedback(
    svc: CollectionService,
    name: str,
    raw: Any,
    param: str,
    using: str | None = None,
    lookup: LookupLocation | None = None,
) -> Found:
    """``{"relevance_feedback": {target, feedback, strategy}}``
    (:func:`service.collections.recommend.relevance_feedback`).

    Raises:
        InvalidCollectionRequest: malformed input, a strategy other than ``naive``; and what the core's query raises.
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
    scored = [(_example(x), f["score"]) for x, f in zip(examples, feedback)]
    ex = _examples(svc, name, using, lookup)
    return await by_example.relevance_feedback(ex, _example(target), scored, naive, param)
