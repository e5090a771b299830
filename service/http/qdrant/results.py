"""Points and hits as Qdrant answers them: ``Record`` ``{id, payload, vector}`` and ``ScoredPoint``
``{id, version, score, payload, vector}`` (Qdrant API reference, schemas ``Record`` and ``ScoredPoint``).

``version`` is always 0 (points carry no per-point version here). Scores are the collections' own: cosine and dot
similarity (higher is better), Euclidean distance for ``Euclid`` (lower is better), as in Qdrant.
"""

from __future__ import annotations

from typing import Any

from service.collections.conditions import payload_names
from service.collections.payload_update import without_keys
from service.collections.schema import VectorsConfig
from service.http.qdrant.vectors import shown

MISSING = object()


def select_payload(payload: dict[str, Any] | None, sel: Any) -> dict[str, Any] | None:
    """The payload as ``with_payload`` asks: ``True`` all of it, ``False``/``None`` none (None), a list of keys or
    ``{"include": [...]}`` those keys only, ``{"exclude": [...]}`` all but those (dotted keys reach into objects,
    both ways, as in Qdrant)."""
    if not sel:
        return None
    payload = payload or {}
    if sel is True:
        return payload
    if isinstance(sel, dict) and "exclude" in sel:
        return without_keys(payload, sel["exclude"])  # dotted keys reach into objects, as for include
    keys = sel["include"] if isinstance(sel, dict) else sel
    out: dict[str, Any] = {}
    for key in keys:
        value = lookup(payload, key)
        if value is not MISSING:
            _place(out, key, value)
    return out


def lookup(obj: Any, key: str) -> Any:
    """The value at a dotted ``key`` (``"meta.lang"`` reaches into objects, ``'a."b.c"'`` the key ``b.c`` of ``a``:
    :func:`~service.collections.conditions.payload_names`) of a payload, or :data:`MISSING` (a path into arrays
    too)."""
    names = payload_names(key)
    if names is None:
        return MISSING
    for part in names:
        if not isinstance(obj, dict) or part not in obj:
            return MISSING
        obj = obj[part]
    return obj


def _place(out: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = payload_names(key) or (key,)
    for p in parents:
        out = out.setdefault(p, {})
    out[last] = value


def values_at(payload: dict[str, Any] | None, key: str) -> list[tuple[int, Any]]:
    """The distinct string, integer and boolean values at the dotted ``key`` (the value, or an array's elements), each
    once as ``(rank, value)``: rank 0 booleans, 1 integers, 2 strings (so ``True`` and ``1`` stay apart, and values
    sort by rank first). What Qdrant groups (integers, strings) and counts in a facet (booleans too) by."""
    v = lookup(payload or {}, key)
    out: dict[tuple[int, Any], None] = {}
    for x in v if isinstance(v, list) else [v]:
        if isinstance(x, (bool, int, str)):
            out[(0 if isinstance(x, bool) else 1 if isinstance(x, int) else 2, x)] = None
    return list(out)


def record(point: dict[str, Any], with_payload: Any, with_vector: Any, cfg: VectorsConfig) -> dict[str, Any]:
    """A stored point ``{id, text, payload[, vector][, vectors]}`` of a collection with vectors ``cfg`` as Qdrant's
    ``Record`` (its vectors shaped by :func:`.vectors.shown`)."""
    return {
        "id": point["id"],
        "payload": select_payload(point.get("payload"), with_payload),
        "vector": shown(point, with_vector, cfg),
    }


def scored(hit: Any, with_payload: Any, vector: Any = None) -> dict[str, Any]:
    """A search hit (``service.collections.Hit``) as Qdrant's ``ScoredPoint``."""
    return {
        "id": hit.id,
        "version": 0,
        "score": hit.score,
        "payload": select_payload(hit.payload, with_payload),
        "vector": vector,
    }
