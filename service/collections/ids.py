"""Point ids as stored by every backend: the id's JSON text (``7`` and ``"7"`` are different ids)."""

from __future__ import annotations

import json


def encode_id(point_id: int | str) -> str:
    """The stored key of a point id: its JSON text (``7`` -> ``'7'``, ``"a"`` -> ``'"a"'``)."""
    return json.dumps(point_id, ensure_ascii=False)


def decode_id(key: str) -> int | str:
    """Inverse of :func:`encode_id`."""
    return json.loads(key)
