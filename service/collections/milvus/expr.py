"""Payload filters (:mod:`..filters`) as Milvus boolean expressions over the JSON ``payload`` field.

Milvus compares JSON values by type, as the embedded backend does (``payload["y"] == 2020`` matches 2020 and
2020.0, not ``"2020"``; ``true`` does not match 1; a missing key never matches). Two gaps are bridged here:

* Milvus 2.3 cannot test a JSON ``null``; every point therefore also stores ``nulls = {"p": [dotted keys whose
  value is null]}`` (:func:`null_paths`), and ``key == null`` becomes ``json_contains(nulls["p"], "key")``.
* an ``in`` list must hold one type; a mixed ``$in`` becomes an OR of one ``in`` per type.

String literals are JSON-escaped (Milvus reads JSON string escapes). Keys cannot hold quotes, backslashes, dots or
brackets (the filter grammar refuses them), so they need no escaping.
"""

from __future__ import annotations

import json
from typing import Any

from ..filters import Condition


def null_paths(payload: dict[str, Any] | None, prefix: str = "") -> list[str]:
    """Dotted keys of ``payload`` (nested objects included) whose value is ``null``."""
    out: list[str] = []
    for k, v in (payload or {}).items():
        path = f"{prefix}{k}"
        if v is None:
            out.append(path)
        elif isinstance(v, dict):
            out.extend(null_paths(v, f"{path}."))
    return out


def _field(key: str) -> str:
    return "payload" + "".join(f'["{p}"]' for p in key.split("."))


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v, ensure_ascii=False)


def _type(v: Any) -> str:
    return "bool" if isinstance(v, bool) else "num" if isinstance(v, (int, float)) else "str"


def condition_expr(c: Condition) -> str:
    """One condition: ``payload[key]`` equals one of its values."""
    alts: list[str] = []
    if any(v is None for v in c.values):
        alts.append(f'json_contains(nulls["p"], {_literal(c.key)})')
    by_type: dict[str, list[Any]] = {}
    for v in c.values:
        if v is not None:
            by_type.setdefault(_type(v), []).append(v)
    for vals in by_type.values():
        if len(vals) == 1:
            alts.append(f"{_field(c.key)} == {_literal(vals[0])}")
        else:
            alts.append(f"{_field(c.key)} in [{', '.join(_literal(v) for v in vals)}]")
    return alts[0] if len(alts) == 1 else "(" + " or ".join(alts) + ")"


def to_expr(conditions: list[Condition] | None) -> str:
    """The AND of every condition as one Milvus expression ('' for no filter)."""
    return " and ".join(condition_expr(c) for c in conditions or [])


def keys_expr(keys: list[str]) -> str:
    """``key in [...]`` for encoded point ids."""
    return f"key in [{', '.join(json.dumps(k, ensure_ascii=False) for k in keys)}]"
