"""Checks of the payloads written: plain JSON a filter can match (:func:`check_payload_values`) and at most
``collections_max_payload_bytes`` each (:func:`check_payload_sizes`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

from service.collections.errors import InvalidCollectionRequest


def _json_bytes(payload: dict[str, Any]) -> int:
    """The bytes of ``payload`` as compact UTF-8 JSON: by orjson (C, ~10x faster than ``json.dumps(...,
    ensure_ascii=False, separators=(",", ":"))``, which writes the same but for a float's exponent: ``1e-07``, one
    byte more), by ``json`` for what orjson refuses (integers past 64 bits: the value check that follows names
    them)."""
    try:
        return len(orjson.dumps(payload))
    except TypeError:
        return len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode())


def check_payload_sizes(payloads: list[dict[str, Any] | None], cap: int, what: list[str] | None = None) -> None:
    """Refuse a payload over ``cap`` bytes as compact UTF-8 JSON; ``what[i]`` names payload ``i`` (default:
    ``points[i].payload``).

    Raises:
        InvalidCollectionRequest: naming the first one too large.
    """
    for i, p in enumerate(payloads):
        if p and (n := _json_bytes(p)) > cap:
            field = what[i] if what else f"points[{i}].payload"
            raise InvalidCollectionRequest(
                f"{field} is {n} bytes as JSON; the maximum is {cap} (collections_max_payload_bytes)",
                "payload" if what else field,
            )


INT64 = (-(2**63), 2**63 - 1)  # what SQLite stores and filters compare as integers


MAX_PAYLOAD_DEPTH = 32  # nesting of objects and arrays in a payload


def check_payload_values(v: Any, path: str = "payload", depth: int = 0) -> None:
    """Payloads are plain JSON whose numbers a filter can match: no NaN/Infinity, integers within signed 64 bits,
    objects and arrays nested at most :data:`MAX_PAYLOAD_DEPTH` deep.

    Raises:
        ValueError: naming the offending path.
    """
    if isinstance(v, (dict, list)) and depth >= MAX_PAYLOAD_DEPTH:
        raise ValueError(f"{path}: payload nested more than {MAX_PAYLOAD_DEPTH} deep")
    if isinstance(v, dict):
        for k, x in v.items():
            check_payload_values(x, f"{path}.{k}", depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            check_payload_values(x, f"{path}[{i}]", depth + 1)
    elif isinstance(v, bool) or v is None or isinstance(v, str):
        return
    elif isinstance(v, int):
        if not INT64[0] <= v <= INT64[1]:
            raise ValueError(f"{path}: integer {v} is outside the signed 64-bit range filters can compare")
    elif isinstance(v, float):
        if not np.isfinite(v):
            raise ValueError(f"{path}: payload must be plain JSON (no NaN/Infinity)")
