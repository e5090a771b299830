"""The order of points in an embedded collection's scroll pages: Qdrant's point order (unsigned integer ids
numerically, then string ids), as one SQLite expression over the stored key (:func:`~...ids.encode_id`, the id's
JSON text) that an expression index (``points_order``) keeps sorted."""

from __future__ import annotations

ORDER_KEY = (
    "(CASE WHEN substr(key, 1, 1) = '\"' THEN '1' || key"
    " ELSE '0' || substr('00000000000000000000' || key, -20) END)"
)  # integer ids (at most 20 digits) zero-padded behind '0', string ids behind '1': one text compared byte by byte
ORDER_INDEX = f"CREATE INDEX IF NOT EXISTS points_order ON points{ORDER_KEY}"


def order_key(key: str) -> str:
    """:data:`ORDER_KEY` of a stored key, computed in Python (a scroll's start)."""
    return "1" + key if key.startswith('"') else "0" + key.rjust(20, "0")
