"""Payload filters (:mod:`..filters`) as Milvus boolean expressions over the JSON ``payload`` field.

Milvus 2.3 compares JSON values by type, as the embedded backend does (``payload["y"] == 2020`` matches 2020 and
2020.0, not ``"2020"``; ``true`` does not match 1; a missing key never matches; ``not (...)`` matches it), and
``json_contains_any`` finds array elements by type and value. Its gaps are bridged here (each checked on a real
Milvus 2.3.5 server):

* it cannot test a JSON ``null`` or tell ``[]`` from a scalar: every point also stores
  ``nulls = {"p": [dotted keys whose value is null], "e": [dotted keys whose value is []]}`` (:func:`payload_marks`);
  ``key == null`` becomes ``json_contains(nulls["p"], "key") and exists payload[...]`` and ``$empty`` tests both
  lists the same way (points written before ``"e"`` existed never count as ``[]``). Keys holding a dot are not
  marked (a null or empty test of one, ``'"a.b"'``, is refused); the ``exists`` keeps points marked before that (``{"a.b": null}`` was marked
  ``"a.b"``, as ``{"a": {"b": null}}`` is) from matching where no nested ``a.b`` exists;
* an ``in`` list must hold one type (``in [1, 1.5]`` fails an assertion in the query node): one ``in`` per type;
* ``-9223372036854775808`` does not parse (the parser negates ``9223372036854775808``, out of range): it is written
  as ``< -9223372036854775807`` (no other integer is below it), and inside arrays as the double ``-2**63`` (there
  the 1,024 integers just above the minimum, which round to it, match too);
* ``json_contains_any`` reads array elements as its literal's type (:func:`_element_literals`);
* ``and``/``or`` chains are balanced trees: a left-deep chain of ~50 terms overflows the query plan
  ("Assert data_type == column_info.data_type").

String literals are JSON-escaped (Milvus reads JSON string escapes: quotes, backslashes, newlines, ``\\u0000``; checked
on Milvus 2.3.5). Key parts (the names of a key path, a quoted one as written: ``a."b.c"`` is
``payload["a"]["b.c"]``) are written the same way, but Milvus cannot address every key the grammar allows: a ``/`` in
a key is read as a path separator (``payload["a/b"]`` never finds the key ``"a/b"``), a key with a control character
(the grammar lets one trailing newline through, ``"g\\n"``) Milvus finds, escaped, where the embedded backend's SQLite
finds nothing, and the empty key (``""``) is not addressed. All are refused with 422 ``invalid_filter``
(:func:`key_parts`) rather than answered differently from the embedded backend.
"""

from __future__ import annotations

import json
from typing import Any

from service.collections.conditions import Null, key_names
from service.collections.errors import InvalidCollectionRequest
from service.collections.filters import (
    INT64,
    And,
    Count,
    DateRange,
    Empty,
    Exists,
    Filter,
    Geo,
    HasVector,
    Ids,
    Match,
    MinShould,
    Nested,
    Not,
    Or,
    Range,
    Text,
    balanced,
    value_kind,
)

_RANGE_OPS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def payload_marks(payload: dict[str, Any] | None) -> dict[str, list[str]]:
    """``{"p": null paths, "e": empty-array paths}`` of ``payload`` (dotted keys; nested objects included). A key
    holding a dot is left out, with what is below it: its dotted path would be a nested key's (``{"a.b": null}`` is not
    ``{"a": {"b": null}}``), and a filter's null or empty test of it (``'"a.b"'``) is refused (:func:`_mark`)."""
    marks: dict[str, list[str]] = {"p": [], "e": []}

    def walk(obj: dict[str, Any], prefix: str) -> None:
        for k, v in obj.items():
            if "." in k:
                continue
            path = f"{prefix}{k}"
            if v is None:
                marks["p"].append(path)
            elif v == []:
                marks["e"].append(path)
            elif isinstance(v, dict):
                walk(v, f"{path}.")

    walk(payload or {}, "")
    return marks


def key_parts(key: str) -> list[str]:
    """The names of a filter key path into objects (:func:`...conditions.key_names`: ``a."b.c"`` is ``["a", "b.c"]``),
    each one Milvus can address.

    Raises:
        InvalidCollectionRequest: ``invalid_filter``, a name holds ``/`` or a control character, or is the empty key
            (module docstring).
    """
    parts = list(key_names(key) or ())
    for p in parts:
        if "/" in p or not p or any(ch < " " for ch in p):
            what = (
                "a payload key holding '/' (Milvus reads it as a path separator)"
                if "/" in p
                else "a payload key holding a control character"
                if p
                else "the empty key"
            )
            raise InvalidCollectionRequest(
                f"filter key {key!r}: the milvus backend cannot address {what}",
                param="filter",
                code="invalid_filter",
            )
    return parts


def _field(key: str) -> str:
    return "payload" + "".join(f"[{_literal(p)}]" for p in key_parts(key))


def _mark(key: str) -> str:
    """The literal of ``key``'s path as :func:`payload_marks` writes it (its names joined by dots: ``a."b"`` is
    ``"a.b"``).

    Raises:
        InvalidCollectionRequest: ``unsupported``, a name holding a dot (``a."b.c"``: marks leave such keys out).
    """
    names = key_parts(key)
    if any("." in n for n in names):
        raise InvalidCollectionRequest(
            f"filter key {key!r}: a null or empty test of a key holding a dot is not supported by the milvus backend",
            param="filter",
            code="unsupported",
        )
    return _literal(".".join(names))


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v, ensure_ascii=False)


def _or(alts: list[str]) -> str:
    return balanced(alts, lambda a, b: f"({a} or {b})") if alts else "false"


def _match(m: Match) -> str:
    field = _field(m.key)
    alts: list[str] = []
    if None in m.values:  # the mark, and the nested key there (points written before marks skipped dotted keys)
        alts.append(f'(json_contains(nulls["p"], {_mark(m.key)}) and exists {field})')
    by_kind: dict[str, list[Any]] = {}
    for v in m.values:
        if v is None:
            continue
        if v == INT64[0] and value_kind(v) == "int":
            alts.append(f"{field} < {INT64[0] + 1}")
            continue
        by_kind.setdefault(value_kind(v), []).append(v)
    for vals in by_kind.values():
        lits = ", ".join(_literal(v) for v in vals)
        alts.append(f"{field} == {lits}" if len(vals) == 1 else f"{field} in [{lits}]")
    elems = [e for v in m.values if v is not None for e in _element_literals(v)]
    if elems:  # an array matches when one of its elements does
        alts.append(f"json_contains_any({field}, [{', '.join(_literal(v) for v in elems)}])")
    return _or(alts)


def _element_literals(v: Any) -> list[Any]:
    """How to look for ``v`` among array elements. ``json_contains_any`` reads elements as the literal's type: an
    integer literal does not find ``2.0``, a double literal finds both ``2`` and ``2.0``. So an integer is listed as
    itself (exact) and, below 2**53 in magnitude, as a double too; the int64 minimum, which does not parse, only as
    the double -2**63."""
    if value_kind(v) != "int":
        return [v]
    if v == INT64[0]:
        return [float(v)]
    return [v, float(v)] if abs(v) < 2**53 else [v]


def _bound(op: str, v: int | float) -> tuple[str, int | float]:
    """A bound Milvus can parse: the int64 minimum as an equivalent bound on its neighbour."""
    if v == INT64[0] and not isinstance(v, float):
        return {"gt": (">=", INT64[0] + 1), "gte": (">=", float(v)), "lt": ("<", float(v)), "lte": ("<", INT64[0] + 1)}[
            op
        ]
    return _RANGE_OPS[op], v


def _range(r: Range) -> str:
    field = _field(r.key)
    conds = []
    for name in _RANGE_OPS:
        v = getattr(r, name)
        if v is not None:
            op, lit = _bound(name, v)
            conds.append(f"{field} {op} {_literal(lit)}")
    return balanced(conds, lambda a, b: f"({a} and {b})")


_NOT_IN_MILVUS = {
    MinShould: "$min_should",
    Nested: "$nested",
    Text: "full-text match",
    DateRange: "a datetime range",
    Count: "$count (values count)",
    Geo: "a geo condition",
}


def filter_expr(f: Filter) -> str:
    """One filter tree as a Milvus boolean expression.

    Raises:
        InvalidCollectionRequest: ``unsupported`` (422): a condition Milvus 2.3's expressions cannot state with the
            grammar's semantics (:data:`_NOT_IN_MILVUS`, keys into arrays).
    """
    if type(f) in _NOT_IN_MILVUS or (hasattr(f, "key") and key_names(f.key) is None):
        what = _NOT_IN_MILVUS.get(type(f)) or f"the key into arrays {getattr(f, 'key', '')!r}"
        raise InvalidCollectionRequest(
            f"{what} is not supported by the milvus backend (Milvus 2.3's expressions cannot state it)",
            param="filter",
            code="unsupported",
        )
    if isinstance(f, (And, Or)):
        op = " and " if isinstance(f, And) else " or "
        return balanced([filter_expr(p) for p in f.parts], lambda a, b: f"({a}{op}{b})")
    if isinstance(f, Not):
        return f"(not {filter_expr(f.part)})"
    if isinstance(f, Ids):
        return f"({keys_expr([json.dumps(i, ensure_ascii=False) for i in f.ids])})"
    if isinstance(f, Null):  # the marks hold null values, not arrays holding one: an explicit null only here
        return f"({_match(Match(f.key, (None,)))})"
    if isinstance(f, Match):
        return f"({_match(f)})"
    if isinstance(f, Range):
        return f"({_range(f)})"
    if isinstance(f, HasVector):  # a milvus collection holds one vector, the model-bound one: every point has it
        return '(key != "")' if f.kind == "bound" else '(key == "")'
    if isinstance(f, Exists):
        return f"(exists {_field(f.key)})"
    if isinstance(f, Empty):  # missing, or marked null or [] where the nested key is (see _match)
        key, field = _mark(f.key), _field(f.key)
        marked = f'(json_contains(nulls["p"], {key}) or json_contains(nulls["e"], {key}))'
        return f"((not exists {field}) or ({marked} and exists {field}))"
    raise TypeError(f"not a filter: {f!r}")


def to_expr(where: Filter | None) -> str:
    """The filter as one Milvus expression ('' for no filter)."""
    return filter_expr(where) if where is not None else ""


def keys_expr(keys: list[str]) -> str:
    """``key in [...]`` for encoded point ids."""
    return f"key in [{', '.join(json.dumps(k, ensure_ascii=False) for k in keys)}]"
