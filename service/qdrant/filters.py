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
``{is_null: {key}}``                     ``{key: null}`` (an explicit null)
``{has_id: [ids]}``                      ``{"$ids": [ids]}`` (UUIDs canonicalised, :mod:`.ids`)
``{has_vector: name}``                   ``{"$has_vector": name}``: the point holds that vector
a nested ``Filter`` as a condition       translated recursively
=======================================  ================================================================

Keys are dotted paths (``"meta.lang"``). Not mapped (422 naming it): ``min_should``, ``nested`` (conditions on
elements of an array of objects), array projections in keys (``"tags[]"``), full-text ``match`` (``text``,
``phrase``, ``text_any``), datetime ranges, ``values_count``, geo conditions. An empty filter, or empty
``must``/``should``/``must_not`` lists, match every point, as in Qdrant.
"""

from __future__ import annotations

from typing import Any

from ..collections.errors import InvalidCollectionRequest
from ..collections.filters import MAX_DEPTH
from .envelope import unsupported
from .ids import canonical_id

NEVER: dict[str, Any] = {"$and": [{"$ids": [0]}, {"$not": {"$ids": [0]}}]}  # matches no point
ALWAYS: dict[str, Any] = {"$not": NEVER}  # matches every point
_CLAUSES = ("must", "should", "must_not", "min_should")
_UNMAPPED_FIELD = {"geo_bounding_box": "geo filtering", "geo_radius": "geo filtering", "geo_polygon": "geo filtering",
                   "values_count": "the values_count condition"}  # fmt: skip


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
    if raw.get("min_should") is not None:
        raise unsupported("min_should", f"{param}.min_should")
    parts: list[dict[str, Any]] = []
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
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else {"$and": parts}


def _listed(raw: dict[str, Any], clause: str, param: str) -> list[Any]:
    v = raw.get(clause)
    if v is None:
        return []
    if isinstance(v, dict):
        return [v]  # Qdrant takes one condition or a list
    if not isinstance(v, list):
        raise _bad(f"{param}.{clause} must be a condition or a list of conditions", f"{param}.{clause}")
    return v


def _condition(c: Any, param: str, depth: int) -> dict[str, Any] | None:
    """One condition of a filter ``depth`` filters deep (None: matches every point)."""
    if not isinstance(c, dict) or not c:
        raise _bad(f"{param} must be a condition object", param)
    if "key" in c:
        return _field(c, param)
    if set(c) <= set(_CLAUSES):
        return translate(c, param, depth + 1)
    if len(c) != 1:
        raise _bad(
            f"{param}: a condition has one of key, is_empty, is_null, has_id, has_vector, nested, or a filter", param
        )
    ((kind, arg),) = c.items()
    if kind in ("is_empty", "is_null"):
        if not isinstance(arg, dict) or set(arg) != {"key"} or not isinstance(arg["key"], str):
            raise _bad(f"{param}.{kind} must be {{'key': '<payload key>'}}", f"{param}.{kind}")
        return {arg["key"]: {"$empty": True}} if kind == "is_empty" else {arg["key"]: None}
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
        raise unsupported("the nested condition (on elements of an array of objects)", f"{param}.nested")
    raise _bad(f"{param}: unknown condition {kind!r}", param)


def _field(c: dict[str, Any], param: str) -> dict[str, Any] | None:
    key = c["key"]
    if not isinstance(key, str) or not key:
        raise _bad(f"{param}.key must be a non-empty string", f"{param}.key")
    if "[" in key:
        raise unsupported(f"the array projection in key {key!r}", f"{param}.key")
    given = {k: v for k, v in c.items() if k != "key" and v is not None}
    for k in given:
        if k in _UNMAPPED_FIELD:
            raise unsupported(_UNMAPPED_FIELD[k], f"{param}.{k}")
    if given.keys() - {"match", "range", "is_empty", "is_null"}:
        raise _bad(f"{param}: unknown fields {sorted(given.keys() - {'match', 'range'})}", param)
    out: list[dict[str, Any]] = []
    if "match" in given:
        out.append(_match(key, given["match"], f"{param}.match"))
    if "range" in given:
        out.append(_range(key, given["range"], f"{param}.range"))
    if given.get("is_empty") is not None:
        out.append({key: {"$empty": bool(given["is_empty"])}})
    if given.get("is_null") is not None:
        out.append({key: None} if given["is_null"] else {key: {"$ne": None}})
    if not out:
        raise _bad(f"{param}: a field condition needs match or range", param)
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
    if kind in ("text", "phrase", "text_any"):
        raise unsupported(f"full-text match ({kind})", f"{param}.{kind}")
    raise _bad(f"{param}: unknown match {kind!r} (value, any or except)", param)


def _range(key: str, r: Any, param: str) -> dict[str, Any]:
    if not isinstance(r, dict):
        raise _bad(f"{param} must be an object with gt, gte, lt, lte", param)
    bounds = {k: v for k, v in r.items() if v is not None}
    if bounds.keys() - {"gt", "gte", "lt", "lte"}:
        raise _bad(f"{param}: unknown bounds {sorted(bounds.keys() - {'gt', 'gte', 'lt', 'lte'})}", param)
    if any(isinstance(v, str) for v in bounds.values()):
        raise unsupported("a datetime range", param)
    return {key: {f"${k}": v for k, v in bounds.items()}} if bounds else ALWAYS
