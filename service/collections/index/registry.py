"""The index types a collection can use, by name. The one place that lists them: the HTTP schema, the ingest CLI
and re-embedding read their choices from :func:`index_kinds`.

To add a type: write ``index/<name>.py`` with an :class:`~.base.IndexType` subclass and add an instance to
``_TYPES`` below.
"""

from __future__ import annotations

from typing import Any

from service.collections.index.base import IndexConfigError, IndexType
from service.collections.index.flat import FlatType
from service.collections.index.flat_sq import FlatSQType
from service.collections.index.hnsw import HNSWType
from service.collections.index.hnsw_sq import HNSWSQType
from service.collections.index.ivf_pq import IVFPQType
from service.collections.index.ivf_pq_fs import IVFPQFastScanType
from service.collections.index.ivf_sq import IVFSQType

_TYPES: dict[str, IndexType] = {
    t.name: t
    for t in (FlatType(), HNSWType(), IVFPQType(), FlatSQType(), HNSWSQType(), IVFSQType(), IVFPQFastScanType())
}


def register(index_type: IndexType) -> None:
    """Add (or replace) an index type under ``index_type.name``.

    Raises:
        ValueError: the type has no name.
    """
    if not index_type.name:
        raise ValueError("an index type needs a name")
    _TYPES[index_type.name] = index_type


def index_kinds() -> tuple[str, ...]:
    """The registered type names, in registration order."""
    return tuple(_TYPES)


def get_type(kind: str) -> IndexType:
    """The type registered as ``kind``.

    Raises:
        IndexConfigError: no such type.
    """
    try:
        return _TYPES[kind]
    except KeyError:
        raise IndexConfigError(f"index must be one of {index_kinds()}, got {kind!r}") from None


def normalize_params(kind: str, params: dict[str, Any] | None, dimension: int) -> dict[str, Any]:
    """Fill defaults and validate the params of an index ``kind`` for vectors of ``dimension``
    (each type's docstring lists its params).

    Returns:
        the complete params dict.

    Raises:
        IndexConfigError: unknown kind, unknown param name, or a value out of range.
    """
    return get_type(kind).normalize_params(dict(params or {}), dimension)
