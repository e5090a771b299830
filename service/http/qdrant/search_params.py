"""Qdrant's ``SearchParams`` of a search (Qdrant API reference, schema ``SearchParams``) translated onto the core's
query model: ``exact`` (score every stored vector), ``hnsw_ef`` (an HNSW graph's search breadth, at least the limit)
and ``quantization`` (``QuantizationSearchParams``: ``ignore``, ``rescore``, ``oversampling`` >= 1;
:class:`~service.collections.query_model.QuantizationSearch`). ``indexed_only``, ``acorn`` and ``idf`` are accepted
with no effect."""

from __future__ import annotations

from typing import Any

from service.collections.errors import InvalidCollectionRequest
from service.collections.index import MAX_HNSW_EF
from service.collections.query_model import QuantizationSearch

QUANTIZATION_KEYS = {"ignore", "rescore", "oversampling"}


def exact(params: dict[str, Any] | None) -> bool:
    """Qdrant's ``params.exact`` (default false)."""
    return bool((params or {}).get("exact"))


def hnsw_ef(params: dict[str, Any] | None, param: str) -> int | None:
    """Qdrant's ``params.hnsw_ef`` (None when not given: the index's ``ef_search``).

    Raises:
        InvalidCollectionRequest: not an integer in [1, :data:`MAX_HNSW_EF`].
    """
    ef = (params or {}).get("hnsw_ef")
    if ef is None:
        return None
    if isinstance(ef, bool) or not isinstance(ef, int) or not 1 <= ef <= MAX_HNSW_EF:
        at = f"{param}params.hnsw_ef"
        raise InvalidCollectionRequest(f"{at} must be an integer in [1, {MAX_HNSW_EF}], got {ef!r}", at)
    return ef


def quantization(params: dict[str, Any] | None, param: str) -> QuantizationSearch | None:
    """The core's :class:`~service.collections.query_model.QuantizationSearch` of ``params.quantization`` (None when
    not given: the index's defaults).

    Raises:
        InvalidCollectionRequest: not an object, an unknown key, ``ignore``/``rescore`` not booleans (or null),
            ``oversampling`` not a number >= 1 (or null).
    """
    q = (params or {}).get("quantization")
    at = f"{param}params.quantization"
    if q is None:
        return None
    if not isinstance(q, dict) or set(q) - QUANTIZATION_KEYS:
        raise InvalidCollectionRequest(f"{at} must be an object with keys {sorted(QUANTIZATION_KEYS)}", param=at)
    for key in ("ignore", "rescore"):
        if q.get(key) is not None and not isinstance(q[key], bool):
            raise InvalidCollectionRequest(f"{at}.{key} must be a boolean, got {q[key]!r}", param=f"{at}.{key}")
    o = q.get("oversampling")
    if o is not None and (isinstance(o, bool) or not isinstance(o, (int, float)) or not 1 <= o <= 1000):
        raise InvalidCollectionRequest(
            f"{at}.oversampling must be a number in [1, 1000], got {o!r}", f"{at}.oversampling"
        )
    return QuantizationSearch(bool(q.get("ignore")), q.get("rescore"), None if o is None else float(o))
