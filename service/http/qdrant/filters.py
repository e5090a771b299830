"""Qdrant filters translated onto the collections' filter grammar (``service.collections.filters``), which the
backends evaluate: nothing is evaluated here.

Qdrant API reference: ``Filter`` and ``Condition`` (https://api.qdrant.tech/api-reference, schemas; concepts:
https://qdrant.tech/documentation/concepts/filtering/).

=======================================  ================================================================
Qdrant                                   collections grammar
=======================================  ================================================================
``must: [c, ...]``                       ``{"$and": [c, ...]}`` (every condition)
``should: [c, ...]``                     ``{"$or": [c, ...]}`` (at least one)
``must_not: [c, ...]``                   ``{"$not": {"$or": [c, ...]}}`` (none)
``{key, match: {value: v}}``             ``{key: v}`` (an array matches when one element does, as in Qdrant)
``{key, match: {any: [...]}}``           ``{key: {"$in": [...]}}``
``{key, match: {except: [...]}}``        ``{key: {"$exists": true, "$nin": [...]}}`` (the key must hold a value)
``{key, range: {gt, gte, lt, lte}}``     ``{key: {"$gt": ..., ...}}`` (numbers only)
``{is_empty: {key}}``                    ``{key: {"$empty": true}}`` (missing, null or ``[]``)
``{is_null: {key}}``                     ``{key: {"$null": true}}`` (null, or an array holding a null)
``{has_id: [ids]}``                      ``{"$ids": [ids]}`` (UUIDs canonicalised, :mod:`.ids`)
``{has_vector: name}``                   ``{"$has_vector": name}``: the point holds that vector
``min_should: {conditions, min_count}``  ``{"$min_should": {"filters": [...], "count": min_count}}``
``{nested: {key, filter}}``              ``{"$nested": {"key": key, "filter": ...}}``
``{key, match: {text | text_any |``      ``{key: {"$text" | "$text_any" | "$phrase": ...}}`` (tokens, as
``phrase: ...}}``                        Qdrant on a field without a text index)
``{key, range: {gt: datetime, ...}}``    ``{key: {"$gt": datetime, ...}}`` (a datetime range)
``{key, values_count: {gt, ...}}``       ``{key: {"$count": {"$gt": ..., ...}}}``
``{key, geo_radius | geo_bounding_box``  ``{key: {"$geo_radius" | "$geo_box" | "$geo_polygon": ...}}``
``| geo_polygon: ...}``
a nested ``Filter`` as a condition       translated recursively
=======================================  ================================================================

Keys are dotted paths (``"meta.lang"``) and may reach into arrays (``"tags[].name"``, ``"a[0]"``). Not mapped (422
naming it): ``match`` by ``prefix``/``substring``, ``slice`` conditions. An empty filter, or empty
``must``/``should``/``must_not`` lists, match every point, as in Qdrant. The Milvus backend refuses what its
expressions cannot state (:mod:`~service.collections.milvus.expr`).
"""

from __future__ import annotations

from typing import Any

from service.collections.errors import InvalidCollectionRequest
from service.collections.filters import MAX_DEPTH
from service.http.qdrant.ids import canonical_id

NEVER: dict[str, Any] = {"$and": [{"$ids": [0]}, {"$not": {"$ids": [0]}}]}  # matches no point
ALWAYS: dict[str, Any] = {"$not": NEVER}  # matches every point
_CLAUSES = ("must", "should", "must_not", "min_should")
_GEO = {"geo_bounding_box": "$geo_box", "geo_radius": "$geo_radius", "geo_polygon": "$geo_polygon"}
_TEXT = {"text": "$text", "text_any": "$text_any", "phrase": "$phrase"}


def _bad(msg: str, param: str) -> InvalidCollectionRequest:
    return InvalidCollectionRequest(msg, param=param, code="invalid_filter")


def translate(raw: Any, param: str = "filter", depth: int = 0) -> dict[str, Any] | None:
    """The collections-grammar filter of a Qdrant ``Filter`` (None: matches every point); ``depth``: how many filters
    enclose this one.

    Raises:
        InvalidCollectionRequest: ``invalid_filter`` (malformed, or filters nested more than the collections'
            :data:`~service.collections.filters.MAX_DEPTH` deep) or ``invalid_value`` (not mapped), naming ``param``.
    """
    if raw is None:
        return None
    if depth > MAX_DEPTH:
        raise _bad(f"{param}: filters nested more than {MAX_DEPTH} deep", param)
    if not isinstance(raw, dict):
        raise _bad(f"{param} must be an object with must/should/must_not", param)
    unknown = set(raw) - set(_CLAUSES)
    if unknown:
        raise _bad(f"{param}: unknown fields {sorted(unknown)} (a filter has {', '.join(_CLAUSES[:3])})", param)
    parts: list[dict[str, Any]] = []
    if raw.get("min_should") is not None:
        parts.append(_min_should(raw["min_should"], f"{param}.min_should", depth))
    for clause in ("must", "should", "must_not"):
        conds = [
            c
            for c in (_condition(c, f"{param}.{clause}[{i}]", depth) for i, c in enumerate(_listed(raw, clause, param)))
        ]
        if not conds:
            continue
        if clause == "must":
            parts += [c for c in conds if c is not None]
        elif clause == "should":
            if all(c is not None for c in conds):  # a condition that matches everything satisfies the should
                parts.append(conds[0] if len(conds) == 1 else {"$or": conds})
        else:
            parts.append(
                NEVER if any(c is None for c in conds) else {"$not": conds[0] if len(conds) == 1 else {"$or": conds}}
            )
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else {"$and": parts}


def _min_should(m: Any, param: str, depth: int) -> dict[str, Any] | None:
    """``{conditions, min_count}``: conditions matching every point count as met (None: every point matches)."""
    if not isinstance(m, dict) or set(m) != {"conditions", "min_count"} or not isinstance(m["conditions"], list):
        raise _bad(f"{param} must be {{'conditions': [...], 'min_count': N}}", param)
    n = m["min_count"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _bad(f"{param}.min_count must be an integer of 1 or more", f"{param}.min_count")
    conds = [_condition(c, f"{param}.conditions[{i}]", depth) for i, c in enumerate(m["conditions"])]
    kept = [c for c in conds if c is not None]
    n -= len(conds) - len(kept)
    if n <= 0:
        return None
    return NEVER if n > len(kept) else {"$min_should": {"filters": kept, "count": n}}


def _listed(raw: dict[str, Any], clause: str, param: str) -> list[Any]:
    v = raw.get(clause)
    if v is None:
        return []
    if isinstance(v, dict):
        return [v]  # Qdrant takes one condition or a list
    if not isinstance(v, list):
        raise _bad(f"{param}.{clause} must be a condition or a list of conditions", f"{param}.{clause}")
    return v


def _condition(cond: Any, param: str, depth: int) -> dict[str, Any] | None:
    """One condition of a filter ``depth`` filters deep (None: matches every point)."""
    if not isinstance(cond, dict) or not cond:
        raise _bad(f"{param} must be a condition object", param)
    if "key" in cond:
        return _field(cond, param)
    if set(cond) <= set(_CLAUSES):
        return translate(cond, param, depth + 1)
    if len(cond) != 1:
        raise _bad(
            f"{param}: a condition has one of key, is_empty, is_null, has_id, has_vector, nested, or a filter", param
        )
    ((kind, arg),) = cond.items()
    if kind in ("is_empty", "is_null"):
        if not isinstance(arg, dict) or set(arg) != {"key"} or not isinstance(arg["key"], str):
            raise _bad(f"{param}.{kind} must be {{'key': '<payload key>'}}", f"{param}.{kind}")
        return {arg["key"]: {"$empty": True} if kind == "is_empty" else {"$null": True}}
    if kind == "has_id":
        if not isinstance(arg, list):
            raise _bad(f"{param}.has_id must be a list of point ids", f"{param}.has_id")
        if not arg:
            return NEVER
        try:
            return {"$ids": [canonical_id(i) if isinstance(i, str) else i for i in arg]}
        except ValueError as e:
            raise _bad(f"{param}.has_id: {e}", f"{param}.has_id") from e
    if kind == "has_vector":
        if not isinstance(arg, str):
            raise _bad(f"{param}.has_vector must be a vector name", f"{param}.has_vector")
        return {"$has_vector": arg}
    if kind == "nested":
        if not isinstance(arg, dict) or set(arg) != {"key", "filter"} or not isinstance(arg["key"], str):
            raise _bad(f"{param}.nested must be {{'key': '<array key>', 'filter': {{...}}}}", f"{param}.nested")
        inner = translate(arg["filter"], f"{param}.nested.filter", depth + 1)
        return {"$nested": {"key": arg["key"], "filter": ALWAYS if inner is None else inner}}
    raise _bad(f"{param}: unknown condition {kind!r}", param)


def _field(c: dict[str, Any], param: str) -> dict[str, Any] | None:
    key = c["key"]
    if not isinstance(key, str) or not key:
        raise _bad(f"{param}.key must be a non-empty string", f"{param}.key")
    given = {k: v for k, v in c.items() if k != "key" and v is not None}
    known = {"match", "range", "is_empty", "is_null", "values_count", *_GEO}
    if given.keys() - known:
        raise _bad(f"{param}: unknown fields {sorted(given.keys() - known)}", param)
    out: list[dict[str, Any]] = [{key: {_GEO[k]: given[k]}} for k in _GEO if k in given]
    if "values_count" in given:
        out.append({key: {"$count": _bounds(given["values_count"], f"{param}.values_count") or {"$gte": 0}}})
    if "match" in given:
        out.append(_match(key, given["match"], f"{param}.match"))
    if "range" in given:
        out.append(_range(key, given["range"], f"{param}.range"))
    if given.get("is_empty") is not None:
        out.append({key: {"$empty": bool(given["is_empty"])}})
    if given.get("is_null") is not None:
        out.append({key: {"$null": bool(given["is_null"])}})
    if not out:
        raise _bad(f"{param}: a field condition needs match, range, values_count or a geo area", param)
    return out[0] if len(out) == 1 else {"$and": out}


def _match(key: str, m: Any, param: str) -> dict[str, Any]:
    if not isinstance(m, dict) or len(m) != 1:
        raise _bad(f"{param} must have exactly one of value, any, except", param)
    ((kind, arg),) = m.items()
    if kind == "value":
        if isinstance(arg, (list, dict)) or arg is None:
            raise _bad(f"{param}.value must be a string, integer or boolean", f"{param}.value")
        return {key: arg}
    if kind in ("any", "except"):
        if not isinstance(arg, list):
            raise _bad(f"{param}.{kind} must be a list", f"{param}.{kind}")
        if kind == "any":
            return {key: {"$in": arg}} if arg else NEVER
        return {key: {"$exists": True, "$nin": arg}} if arg else {key: {"$exists": True}}
    if kind in _TEXT:
        if not isinstance(arg, str):
            raise _bad(f"{param}.{kind} must be a string", f"{param}.{kind}")
        return {key: {_TEXT[kind]: arg}}
    raise _bad(f"{param}: unknown match {kind!r} (value, any or except)", param)


def _bounds(r: Any, param: str) -> dict[str, Any]:
    """``{"$gt": ..., ...}`` of a Qdrant range object (``gt``, ``gte``, ``lt``, ``lte``; nulls dropped)."""
    if not isinstance(r, dict):
        raise _bad(f"{param} must be an object with gt, gte, lt, lte", param)
    bounds = {k: v for k, v in r.items() if v is not None}
    if bounds.keys() - {"gt", "gte", "lt", "lte"}:
        raise _bad(f"{param}: unknown bounds {sorted(bounds.keys() - {'gt', 'gte', 'lt', 'lte'})}", param)
    return {f"${k}": v for k, v in bounds.items()}


def _range(key: str, r: Any, param: str) -> dict[str, Any]:
    """A numeric range, or a datetime range when its bounds are strings (Qdrant's ``DatetimeRange``)."""
    bounds = _bounds(r, param)
    return {key: bounds} if bounds else ALWAYS
