"""Payload filters: grammar, validation and translation to SQL over stored payloads.

Grammar (a JSON object; every listed condition must hold, i.e. AND)::

    filter    := { KEY: condition, ... }              # at least one key
    condition := SCALAR                               # payload[KEY] == SCALAR
               | { "$eq": SCALAR }                    # the same, spelled out
               | { "$in": [SCALAR, ...] }             # payload[KEY] equals any listed value (1..1024 values)
    SCALAR    := string | number | true | false | null
    KEY       := non-empty string; dots address nested objects ("meta.lang")

Matching is by JSON type *and* value: ``{"year": 2020}`` matches the number 2020
(``2020.0`` too) but not the string ``"2020"``; ``true`` matches only the boolean
``true``; ``null`` matches an explicit ``null`` (not a missing key). A point
whose payload lacks the key never matches. Anything else (a list or object as a
value, an unknown ``$`` operator, an empty ``$in`` list, a non-object filter) is
malformed: :class:`FilterError`, answered as 422.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_IN_VALUES = 1024
_KEY_PART = re.compile(r"^[^\"\\.$\[\]\x00-\x1f][^\"\\.\[\]\x00-\x1f]*$")


class FilterError(ValueError):
    """A filter does not follow the grammar; the message says where."""


@dataclass(frozen=True)
class Condition:
    """One parsed condition: ``payload[key]`` is one of ``values`` (JSON scalars)."""

    key: str
    values: tuple[Any, ...]


def _check_scalar(v: Any, where: str) -> Any:
    if v is None or isinstance(v, (str, bool, int, float)):
        if isinstance(v, float) and v != v:  # NaN never equals anything
            raise FilterError(f"{where}: NaN is not a valid filter value")
        if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
            raise FilterError(f"{where}: integer out of the 64-bit range")
        return v
    raise FilterError(f"{where}: expected a string, number, boolean or null, got {type(v).__name__}")


def parse_filter(raw: Any) -> list[Condition]:
    """Validate ``raw`` against the grammar and return its conditions (ANDed).

    Raises:
        FilterError: ``raw`` is malformed (not an object, empty, bad key, bad operator or value).
    """
    if not isinstance(raw, dict):
        raise FilterError(f"filter must be a JSON object, got {type(raw).__name__}")
    if not raw:
        raise FilterError("filter must have at least one condition")
    out: list[Condition] = []
    for key, cond in raw.items():
        if not isinstance(key, str) or not key or not all(_KEY_PART.match(p) for p in key.split(".")):
            raise FilterError(
                f"filter key {key!r} is not a valid payload key (no '$' prefix, quotes, brackets or empty parts)"
            )
        if isinstance(cond, dict):
            if len(cond) != 1:
                raise FilterError(f"filter.{key}: an operator object holds exactly one of '$eq', '$in'")
            ((op, arg),) = cond.items()
            if op == "$eq":
                out.append(Condition(key, (_check_scalar(arg, f"filter.{key}.$eq"),)))
            elif op == "$in":
                if not isinstance(arg, list) or not arg:
                    raise FilterError(f"filter.{key}.$in must be a non-empty list")
                if len(arg) > MAX_IN_VALUES:
                    raise FilterError(f"filter.{key}.$in has {len(arg)} values; at most {MAX_IN_VALUES}")
                out.append(Condition(key, tuple(_check_scalar(v, f"filter.{key}.$in[{i}]") for i, v in enumerate(arg))))
            else:
                raise FilterError(f"filter.{key}: unknown operator {op!r} (supported: '$eq', '$in')")
        else:
            out.append(Condition(key, (_check_scalar(cond, f"filter.{key}"),)))
    return out


def _json_path(key: str) -> str:
    return "$" + "".join(f'."{p}"' for p in key.split("."))


def _value_sql(column: str, path: str, v: Any) -> tuple[str, list[Any]]:
    """SQL testing that ``column`` at JSON ``path`` equals the scalar ``v`` (type-aware)."""
    if v is None:
        return f"json_type({column}, ?) = 'null'", [path]
    if isinstance(v, bool):
        return f"json_type({column}, ?) = '{'true' if v else 'false'}'", [path]
    if isinstance(v, (int, float)):
        return f"(json_type({column}, ?) IN ('integer', 'real') AND json_extract({column}, ?) = ?)", [path, path, v]
    return f"(json_type({column}, ?) = 'text' AND json_extract({column}, ?) = ?)", [path, path, v]


def to_sql(conditions: list[Condition], column: str = "payload") -> tuple[str, list[Any]]:
    """A SQL boolean expression over the JSON text ``column`` and its parameters.

    Returns:
        ``(sql, params)`` to put after ``WHERE``.
    """
    parts: list[str] = []
    params: list[Any] = []
    for c in conditions:
        path = _json_path(c.key)
        alts = []
        for v in c.values:
            s, p = _value_sql(column, path, v)
            alts.append(s)
            params.extend(p)
        parts.append("(" + " OR ".join(alts) + ")")
    return " AND ".join(parts), params


def matches(conditions: list[Condition], payload: dict[str, Any] | None) -> bool:
    """Whether ``payload`` satisfies every condition (the Python twin of :func:`to_sql`, for tests/checks)."""
    for c in conditions:
        cur: Any = payload
        for part in c.key.split("."):
            if not isinstance(cur, dict) or part not in cur:
                return False
            cur = cur[part]
        ok = False
        for v in c.values:
            if v is None:
                ok = cur is None
            elif isinstance(v, bool):
                ok = cur is v
            elif isinstance(v, (int, float)):
                ok = isinstance(cur, (int, float)) and not isinstance(cur, bool) and cur == v
            else:
                ok = isinstance(cur, str) and cur == v
            if ok:
                break
        if not ok:
            return False
    return True


def canonical(raw: Any) -> str:
    """A stable JSON text of a filter (for logs)."""
    return json.dumps(raw, sort_keys=True, separators=(",", ":"))
