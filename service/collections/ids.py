"""Point ids as stored by every backend: the id's JSON text (``7`` and ``"7"`` are different ids)."""

from __future__ import annotations

import json


def encode_id(point_id: int | str) -> str:
    """The stored key of a point id: its JSON text (``7`` -> ``'7'``, ``"a"`` -> ``'"a"'``)."""
    return json.dumps(point_id, ensure_ascii=False)


def last_occurrences(point_ids: list[int | str]) -> tuple[list[str], list[int]]:
    """``(keys, positions)``: the stored key of every distinct id of ``point_ids`` (:func:`encode_id`) and the position
    of its last occurrence (a batch repeating an id keeps its last point), in the order of first occurrence."""
    last: dict[str, int] = {}
    for i, pid in enumerate(point_ids):
        last[encode_id(pid)] = i
    return list(last.keys()), list(last.values())


def decode_id(key: str) -> int | str:
    """Inverse of :func:`encode_id`."""
    return json.loads(key)
